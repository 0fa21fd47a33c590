package private

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/testenv"
)

// clusterNodeTimeout is the cluster-node-timeout of a private Redis Cluster: how long a
// master may stay unreachable before the others mark it failed and its replica is
// promoted (about one to two node timeouts later).
const clusterNodeTimeout = time.Second

// Cluster is a Redis Cluster of one test alone: masters with their replicas, each node a
// redis-server of its own on loopback ports of its own, with an append-only file fsynced
// before every reply (appendfsync always, as docs/deploy.md asks of production) and a short
// cluster-node-timeout, so that a test can kill a master and watch its replica take over.
type Cluster struct {
	tb    testing.TB
	nodes map[string]*RedisServer // by address
	addrs []string                // in creation order: the masters first
	// slots holds the slots (first, last) a killed master served when it was killed.
	slots map[string][][2]int
}

// StartRedisCluster starts masters × (1 + replicasPerMaster) private Redis nodes, makes
// them a cluster with `redis-cli --cluster create` (the slots spread evenly over the
// masters) and returns once every node reports cluster_state:ok and every master has its
// replicas connected and in sync. Every node is killed when the test ends.
func StartRedisCluster(tb testing.TB, masters, replicasPerMaster int) *Cluster {
	tb.Helper()
	if masters < 3 {
		tb.Fatalf("StartRedisCluster: %d masters, Redis Cluster wants at least 3", masters)
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(tb, "a private Redis Cluster", "PATH", "redis-server not found")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		testenv.Unavailable(tb, "a private Redis Cluster", "PATH", "redis-cli not found")
	}
	c := &Cluster{tb: tb, nodes: map[string]*RedisServer{}, slots: map[string][][2]int{}}
	for range masters * (1 + replicasPerMaster) {
		// The cluster bus gets a free port of its own: the default, port + 10000, may be
		// taken or past 65535.
		_, bus, _ := net.SplitHostPort(testenv.FreeAddr(tb))
		r := &RedisServer{tb: tb, addr: testenv.FreeAddr(tb), dir: tb.TempDir(), path: path, fsync: "always",
			extra: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", bus,
				"--cluster-node-timeout", strconv.FormatInt(clusterNodeTimeout.Milliseconds(), 10)}}
		tb.Cleanup(r.kill)
		r.Start()
		c.nodes[r.addr] = r
		c.addrs = append(c.addrs, r.addr)
	}
	args := append([]string{"--cluster", "create"}, c.addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := testenv.Context(tb, 2*time.Minute)
	if err := c.waitHealthy(ctx, replicasPerMaster); err != nil {
		tb.Fatalf("private Redis Cluster: %v", err)
	}
	return c
}

// Addrs are the addresses of every node, killed ones included: seeds for a client.
func (c *Cluster) Addrs() []string { return append([]string(nil), c.addrs...) }

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, master string // master: the id of the node's master, "-" for a master
	flags            []string
	slots            [][2]int
}

func (n clusterNode) is(flag string) bool {
	for _, f := range n.flags {
		if f == flag {
			return true
		}
	}
	return false
}

// serves reports whether n is a master not marked failing that serves slot.
func (n clusterNode) serves(slot int) bool {
	if !n.is("master") || n.is("fail") || n.is("fail?") {
		return false
	}
	for _, r := range n.slots {
		if r[0] <= slot && slot <= r[1] {
			return true
		}
	}
	return false
}

// topology is the cluster as the node at addr sees it (CLUSTER NODES).
func topology(ctx context.Context, addr string) ([]clusterNode, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer func() { _ = rdb.Close() }()
	text, err := rdb.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER NODES on %s: %w", addr, err)
	}
	var out []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		hostPort, _, _ := strings.Cut(f[1], "@")
		n := clusterNode{id: f[0], addr: hostPort, master: f[3], flags: strings.Split(f[2], ",")}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") { // a slot being migrated
				continue
			}
			lo, hi, found := strings.Cut(s, "-")
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if !found {
				b, err2 = a, nil
			}
			if err1 == nil && err2 == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// info returns the named section of INFO of the node at addr.
func info(ctx context.Context, addr, section string) (string, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer func() { _ = rdb.Close() }()
	s, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return "", fmt.Errorf("INFO %s on %s: %w", section, addr, err)
	}
	return s, nil
}

// infoField returns the value of name in the text of an INFO (or CLUSTER INFO) reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// clusterOK reports an error unless the node at addr says cluster_state:ok.
func clusterOK(ctx context.Context, addr string) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer func() { _ = rdb.Close() }()
	state, err := rdb.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("CLUSTER INFO on %s: %w", addr, err)
	}
	if v := infoField(state, "cluster_state"); v != "ok" {
		return fmt.Errorf("%s: cluster_state:%s", addr, v)
	}
	return nil
}

// live are the nodes that are running.
func (c *Cluster) live() []string {
	var out []string
	for _, a := range c.addrs {
		r := c.nodes[a]
		r.mu.Lock()
		up := r.proc != nil
		r.mu.Unlock()
		if up {
			out = append(out, a)
		}
	}
	return out
}

// check reports what keeps the cluster from being healthy, nil when it is: every running
// node says cluster_state:ok, and every master has replicas replicas, each online with the
// master's replication offset.
func (c *Cluster) check(ctx context.Context, replicas int) error {
	for _, a := range c.live() {
		if err := clusterOK(ctx, a); err != nil {
			return err
		}
		repl, err := info(ctx, a, "replication")
		if err != nil {
			return err
		}
		if infoField(repl, "role") != "master" {
			continue
		}
		if n := infoField(repl, "connected_slaves"); n != strconv.Itoa(replicas) {
			return fmt.Errorf("master %s has %s connected replicas, want %d", a, n, replicas)
		}
		offset := infoField(repl, "master_repl_offset")
		for i := range replicas {
			r := infoField(repl, "slave"+strconv.Itoa(i))
			if !strings.Contains(r, "state=online") || !strings.Contains(r, "offset="+offset+",") {
				return fmt.Errorf("master %s (offset %s): replica %s is not online and in sync", a, offset, r)
			}
		}
	}
	return nil
}

// waitHealthy polls check until it passes or ctx ends.
func (c *Cluster) waitHealthy(ctx context.Context, replicas int) error {
	for {
		err := c.check(ctx, replicas)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not healthy: %w", errors.Join(err, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// MasterOf returns the address of the master serving key's slot.
func (c *Cluster) MasterOf(key string) string {
	c.tb.Helper()
	ctx := testenv.Context(c.tb, 10*time.Second)
	live := c.live()
	if len(live) == 0 {
		c.tb.Fatal("private Redis Cluster: no node runs")
	}
	rdb := redis.NewClient(&redis.Options{Addr: live[0], MaxRetries: -1})
	defer func() { _ = rdb.Close() }()
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		c.tb.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
	}
	return c.masterOfSlot(int(slot))
}

// masterOfSlot returns the address of the master serving slot, as the first running node
// sees it.
func (c *Cluster) masterOfSlot(slot int) string {
	c.tb.Helper()
	ctx := testenv.Context(c.tb, 10*time.Second)
	nodes, err := topology(ctx, c.live()[0])
	if err != nil {
		c.tb.Fatal(err)
	}
	for _, n := range nodes {
		if n.serves(slot) {
			return n.addr
		}
	}
	c.tb.Fatalf("private Redis Cluster: no master serves slot %d", slot)
	return ""
}

// Masters are the addresses of the masters serving slots, as the first running node sees
// them.
func (c *Cluster) Masters() []string {
	c.tb.Helper()
	ctx := testenv.Context(c.tb, 10*time.Second)
	nodes, err := topology(ctx, c.live()[0])
	if err != nil {
		c.tb.Fatal(err)
	}
	var out []string
	for _, n := range nodes {
		if n.is("master") && !n.is("fail") && len(n.slots) > 0 {
			out = append(out, n.addr)
		}
	}
	return out
}

// CutReplicas cuts the replication link of every replica of the master at addr and keeps
// them from linking again (a masterauth the master refuses), so that the master goes on
// answering writes no replica holds: replicas behind their master when it dies. restore
// lets them link again.
func (c *Cluster) CutReplicas(addr string) (restore func()) {
	c.tb.Helper()
	ctx := testenv.Context(c.tb, 10*time.Second)
	nodes, err := topology(ctx, addr)
	if err != nil {
		c.tb.Fatal(err)
	}
	var id string
	for _, n := range nodes {
		if n.is("myself") {
			id = n.id
		}
	}
	var replicas []string
	for _, n := range nodes {
		if n.master == id && n.is("slave") {
			replicas = append(replicas, n.addr)
		}
	}
	if len(replicas) == 0 {
		c.tb.Fatalf("CutReplicas: %s has no replica", addr)
	}
	set := func(auth string, cut bool) error {
		for _, r := range replicas {
			rdb := redis.NewClient(&redis.Options{Addr: r, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
			err := rdb.ConfigSet(ctx, "masterauth", auth).Err()
			if err == nil && cut {
				err = rdb.ClientKillByFilter(ctx, "TYPE", "master").Err()
			}
			_ = rdb.Close()
			if err != nil {
				return fmt.Errorf("replica %s: %w", r, err)
			}
		}
		return nil
	}
	if err := set("metergate-cut-replica", true); err != nil {
		c.tb.Fatalf("CutReplicas: %v", err)
	}
	return func() {
		c.tb.Helper()
		if err := set("", false); err != nil {
			c.tb.Fatalf("CutReplicas restore: %v", err)
		}
	}
}

// KillMaster SIGKILLs the master at addr (a crash: what it had not yet sent to its
// replicas is gone with it) and returns once its port refuses connections.
func (c *Cluster) KillMaster(addr string) {
	c.tb.Helper()
	r, ok := c.nodes[addr]
	if !ok {
		c.tb.Fatalf("KillMaster: %s is no node of the private cluster", addr)
	}
	ctx := testenv.Context(c.tb, 10*time.Second)
	nodes, err := topology(ctx, addr)
	if err != nil {
		c.tb.Fatal(err)
	}
	var slots [][2]int
	for _, n := range nodes {
		if n.is("myself") {
			if !n.is("master") || len(n.slots) == 0 {
				c.tb.Fatalf("KillMaster: %s is not a master serving slots (flags %v)", addr, n.flags)
			}
			slots = n.slots
		}
	}
	c.slots[addr] = slots
	r.Stop()
}

// WaitPromotion polls the running nodes until each reports cluster_state:ok and names one
// master other than killed (KillMaster) for every slot killed served, and returns it: the
// promoted replica.
func (c *Cluster) WaitPromotion(ctx context.Context, killed string) (string, error) {
	slots, ok := c.slots[killed]
	if !ok {
		return "", fmt.Errorf("WaitPromotion: %s was not killed by KillMaster", killed)
	}
	for {
		promoted, err := c.promoted(ctx, killed, slots)
		if err == nil {
			return promoted, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no replica of %s promoted: %w", killed, errors.Join(err, ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// promoted returns the master that every running node names for slots, nil error when
// they all agree on one other than killed and report cluster_state:ok.
func (c *Cluster) promoted(ctx context.Context, killed string, slots [][2]int) (string, error) {
	var promoted string
	for _, a := range c.live() {
		if err := clusterOK(ctx, a); err != nil {
			return "", err
		}
		nodes, err := topology(ctx, a)
		if err != nil {
			return "", err
		}
		for _, s := range slots {
			owner := ""
			for _, n := range nodes {
				if n.serves(s[0]) && n.serves(s[1]) {
					owner = n.addr
				}
			}
			switch {
			case owner == "" || owner == killed:
				return "", fmt.Errorf("%s: slots %d-%d served by %q", a, s[0], s[1], owner)
			case promoted == "":
				promoted = owner
			case owner != promoted:
				return "", fmt.Errorf("%s: slots %d-%d served by %s, another node by %s", a, s[0], s[1], owner, promoted)
			}
		}
	}
	return promoted, nil
}

// Restart starts the killed node again on its port and data directory and returns once it
// has rejoined as a replica of the master serving its former slots, in sync with it, and
// every node reports cluster_state:ok.
func (c *Cluster) Restart(killed string) {
	c.tb.Helper()
	r, ok := c.nodes[killed]
	if !ok {
		c.tb.Fatalf("Restart: %s is no node of the private cluster", killed)
	}
	slots := c.slots[killed]
	r.Start()
	ctx := testenv.Context(c.tb, 2*time.Minute)
	for {
		err := c.rejoined(ctx, killed, slots)
		if err == nil {
			delete(c.slots, killed)
			return
		}
		if ctx.Err() != nil {
			c.tb.Fatalf("%s did not rejoin as a replica: %v", killed, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rejoined reports what keeps the node at addr from being an in-sync replica of the
// master serving slots in a healthy cluster.
func (c *Cluster) rejoined(ctx context.Context, addr string, slots [][2]int) error {
	nodes, err := topology(ctx, addr)
	if err != nil {
		return err
	}
	var self clusterNode
	byID := map[string]clusterNode{}
	for _, n := range nodes {
		byID[n.id] = n
		if n.is("myself") {
			self = n
		}
	}
	if !self.is("slave") {
		return fmt.Errorf("%s: flags %v, not a replica", addr, self.flags)
	}
	if len(slots) > 0 && !byID[self.master].serves(slots[0][0]) {
		return fmt.Errorf("%s: replica of %s, which does not serve slot %d", addr, byID[self.master].addr, slots[0][0])
	}
	if err := replicaInSync(ctx, addr); err != nil {
		return err
	}
	for _, a := range c.live() {
		if err := clusterOK(ctx, a); err != nil {
			return err
		}
	}
	return nil
}
