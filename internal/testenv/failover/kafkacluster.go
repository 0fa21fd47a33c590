package failover

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/metergate/metergate/internal/testenv"
)

// BrokerCluster is the 3-node Kafka cluster of the local stack (`make up-kafka-cluster`):
// KRaft nodes 1-3, each broker and controller, replication 3, min.insync.replicas 2. A
// test that has it may kill and start its nodes: KafkaCluster hands it to one test at a
// time (in this process and across processes, by a lock file in the stack's state), and
// when the test ends it starts the nodes the test left down and waits until every
// partition of the cluster has all its replicas in sync again.
type BrokerCluster struct {
	// Addrs are the bootstrap addresses of the three nodes, node 1 first.
	Addrs []string

	tb    testing.TB
	nodes map[int]*kafkaNode // by node id
}

// kafkaNode is what the stack's files say of one node.
type kafkaNode struct {
	id       int
	addr     string // PLAINTEXT listener
	ctrlPort string // CONTROLLER listener's port
	dir      string // <run>/kafka-cluster/<id>: server.properties, kafka.pid
	libs     string // the jars it runs from (its -cp)
}

// clusterMu hands the cluster to one test of this process at a time; the lock file does it
// across processes.
var clusterMu sync.Mutex

// KafkaCluster returns the cluster of KAFKA_CLUSTER_BROKERS once its three nodes answer
// and every partition has all its replicas in sync. There is no container fallback:
// `make up-kafka-cluster` starts one. The test holds the cluster until it ends.
func KafkaCluster(tb testing.TB) *BrokerCluster {
	tb.Helper()
	env := os.Getenv("KAFKA_CLUSTER_BROKERS")
	if env == "" {
		testenv.Unavailable(tb, "the Kafka cluster", "KAFKA_CLUSTER_BROKERS", "unset (make up-kafka-cluster writes it to .run/env)")
	}
	addrs := strings.Split(env, ",")
	if len(addrs) != 3 {
		testenv.Unavailable(tb, "the Kafka cluster", "KAFKA_CLUSTER_BROKERS", fmt.Sprintf("%d addresses, want 3", len(addrs)))
	}
	nodes, err := findKafkaNodes(addrs)
	if err != nil {
		testenv.Unavailable(tb, "the Kafka cluster", "KAFKA_CLUSTER_BROKERS", err.Error())
	}
	clusterMu.Lock()
	lock, err := lockFile(filepath.Join(filepath.Dir(nodes[1].dir), "test.lock"))
	if err != nil {
		clusterMu.Unlock()
		tb.Fatalf("lock the Kafka cluster: %v", err)
	}
	c := &BrokerCluster{Addrs: addrs, tb: tb, nodes: nodes}
	tb.Cleanup(func() {
		defer clusterMu.Unlock()
		defer func() { _ = lock.Close() }() // releases the flock
		c.restore()
	})
	ctx := testenv.Context(tb, 3*time.Minute)
	if err := c.waitInSync(ctx, nil); err != nil {
		testenv.Unavailable(tb, "the Kafka cluster", "KAFKA_CLUSTER_BROKERS", err.Error())
	}
	return c
}

// lockFile takes an exclusive flock on path (made when missing), waiting for it.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return f, nil
}

// findKafkaNodes finds the process of each address (a kafka.Kafka whose properties file
// names it as its listener) and, through its properties file, the node's id and files.
func findKafkaNodes(addrs []string) (map[int]*kafkaNode, error) {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return nil, err
	}
	byAddr := map[string]*kafkaNode{}
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(raw), "kafka.Kafka") {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) < 2 || args[len(args)-2] != "kafka.Kafka" {
			continue
		}
		props, err := readProperties(args[len(args)-1])
		if err != nil {
			continue
		}
		n := &kafkaNode{dir: filepath.Dir(args[len(args)-1])}
		n.id, _ = strconv.Atoi(props["node.id"])
		for _, l := range strings.Split(props["listeners"], ",") {
			name, hostPort, _ := strings.Cut(l, "://")
			switch name {
			case "PLAINTEXT":
				n.addr = hostPort
			case "CONTROLLER":
				_, n.ctrlPort, _ = net.SplitHostPort(hostPort)
			}
		}
		for i, a := range args {
			if a == "-cp" && i+1 < len(args) {
				n.libs = strings.TrimSuffix(args[i+1], "/*")
			}
		}
		byAddr[n.addr] = n
	}
	nodes := map[int]*kafkaNode{}
	for i, a := range addrs {
		n, ok := byAddr[a]
		if !ok {
			return nil, fmt.Errorf("no running kafka.Kafka of this machine listens on %s", a)
		}
		if n.id != i+1 {
			return nil, fmt.Errorf("%s is node %d, want node %d", a, n.id, i+1)
		}
		nodes[n.id] = n
	}
	return nodes, nil
}

// readProperties reads a Java properties file of key=value lines.
func readProperties(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			out[k] = v
		}
	}
	return out, sc.Err()
}

// Addr is the bootstrap address of node id (1-3).
func (c *BrokerCluster) Addr(id int) string { return c.node(id).addr }

func (c *BrokerCluster) node(id int) *kafkaNode {
	c.tb.Helper()
	n, ok := c.nodes[id]
	if !ok {
		c.tb.Fatalf("no Kafka cluster node %d", id)
	}
	return n
}

// Metadata asks the first node that answers for the metadata of topics (every topic when
// none). Each call has a transport of its own: kafka-go's transports answer Metadata from a
// cache they refresh in the background, and a transport to a node that died goes on
// answering with what the node said last.
func (c *BrokerCluster) Metadata(ctx context.Context, topics ...string) (*kafka.MetadataResponse, error) {
	var errs []error
	for _, a := range c.Addrs {
		transport := &kafka.Transport{DialTimeout: time.Second}
		client := &kafka.Client{Addr: kafka.TCP(a), Timeout: 2 * time.Second, Transport: transport}
		meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		transport.CloseIdleConnections()
		if err == nil {
			return meta, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", a, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("metadata: %w", errors.Join(errs...))
}

// Leaders returns the partitions of topic each node leads, by node id (a partition without
// a leader under 0).
func (c *BrokerCluster) Leaders(ctx context.Context, topic string) (map[int][]int, error) {
	meta, err := c.Metadata(ctx, topic)
	if err != nil {
		return nil, err
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		return nil, fmt.Errorf("metadata of %s: %v", topic, meta.Topics)
	}
	out := map[int][]int{}
	for _, p := range meta.Topics[0].Partitions {
		out[p.Leader.ID] = append(out[p.Leader.ID], p.ID) // a dead leader is the zero Broker
	}
	for _, ps := range out {
		sort.Ints(ps)
	}
	return out, nil
}

// Kill SIGKILLs node id (by its pidfile) and waits until the process is gone.
func (c *BrokerCluster) Kill(id int) {
	c.tb.Helper()
	n := c.node(id)
	pid, err := n.pid()
	if err != nil {
		c.tb.Fatalf("kill Kafka node %d: %v", id, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		c.tb.Fatalf("SIGKILL Kafka node %d (pid %d): %v", id, pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for processLives(pid) {
		if time.Now().After(deadline) {
			c.tb.Fatalf("Kafka node %d (pid %d) still runs 30 s after SIGKILL", id, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (n *kafkaNode) pid() (int, error) {
	raw, err := os.ReadFile(filepath.Join(n.dir, "kafka.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(raw)))
}

// processLives reports whether pid runs (a zombie does not).
func processLives(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// running reports whether node id's process runs.
func (c *BrokerCluster) running(id int) bool {
	pid, err := c.node(id).pid()
	return err == nil && processLives(pid)
}

// Start starts node id again (`deploy/local/stack.sh start-kafka-node`, in the stack's state
// the node runs from) and waits until it serves and is in the in-sync replicas of every
// partition of topics that it replicates.
func (c *BrokerCluster) Start(id int, topics ...string) {
	c.tb.Helper()
	if err := c.start(id); err != nil {
		c.tb.Fatal(err)
	}
	ctx := testenv.Context(c.tb, 3*time.Minute)
	if err := c.waitInSync(ctx, topics); err != nil {
		c.tb.Fatalf("Kafka node %d started: %v", id, err)
	}
}

func (c *BrokerCluster) start(id int) error {
	n := c.nodes[id]
	script, err := testenv.StackScript()
	if err != nil {
		return fmt.Errorf("start Kafka node %d: %w", id, err)
	}
	var ports, ctrlPorts []string
	for i := 1; i <= 3; i++ {
		_, p, _ := net.SplitHostPort(c.nodes[i].addr)
		ports = append(ports, p)
		ctrlPorts = append(ctrlPorts, c.nodes[i].ctrlPort)
	}
	// The stack's state: <run>/kafka-cluster/<id>; its jars: <cache>/kafka-<version>/libs.
	run := filepath.Dir(filepath.Dir(n.dir))
	version := strings.TrimPrefix(filepath.Base(filepath.Dir(n.libs)), "kafka-")
	cmd := exec.Command("bash", script, "start-kafka-node", strconv.Itoa(id))
	cmd.Env = append(os.Environ(), "METERGATE_RUN_DIR="+run, "METERGATE_CACHE_DIR="+filepath.Dir(filepath.Dir(n.libs)),
		"KAFKA_VERSION="+version, "KAFKA_CLUSTER_PORTS="+strings.Join(ports, " "),
		"KAFKA_CLUSTER_CONTROLLER_PORTS="+strings.Join(ctrlPorts, " "))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("start Kafka node %d (stack.sh start-kafka-node): %w\n%s", id, err, out)
	}
	return nil
}

// waitInSync polls until the three nodes are registered and every partition of topics
// (every topic of the cluster when none) has a leader and all its replicas in sync.
func (c *BrokerCluster) waitInSync(ctx context.Context, topics []string) error {
	var last error
	for {
		last = c.inSync(ctx, topics)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the Kafka cluster is not in sync: %w", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *BrokerCluster) inSync(ctx context.Context, topics []string) error {
	meta, err := c.Metadata(ctx, topics...)
	if err != nil {
		return err
	}
	if len(meta.Brokers) != 3 {
		return fmt.Errorf("%d brokers registered, want 3", len(meta.Brokers))
	}
	for _, t := range meta.Topics {
		if t.Error != nil {
			return fmt.Errorf("topic %s: %w", t.Name, t.Error)
		}
		for _, p := range t.Partitions {
			if p.Leader.ID == 0 || len(p.Isr) != len(p.Replicas) {
				return fmt.Errorf("%s/%d: leader %d, %d of %d replicas in sync", t.Name, p.ID, p.Leader.ID, len(p.Isr), len(p.Replicas))
			}
		}
	}
	return nil
}

// StartAll starts every node that is down, at once, and waits until every
// partition of topics (every topic when none) has all its replicas in sync.
func (c *BrokerCluster) StartAll(topics ...string) {
	c.tb.Helper()
	if err := c.startAll(); err != nil {
		c.tb.Fatal(err)
	}
	ctx := testenv.Context(c.tb, 3*time.Minute)
	if err := c.waitInSync(ctx, topics); err != nil {
		c.tb.Fatalf("Kafka cluster started: %v", err)
	}
}

func (c *BrokerCluster) startAll() error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for id := 1; id <= 3; id++ {
		if c.running(id) {
			continue
		}
		wg.Go(func() {
			if err := c.start(id); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// restore starts the nodes the test left down and waits until the whole cluster is in sync.
func (c *BrokerCluster) restore() {
	if err := c.startAll(); err != nil {
		c.tb.Errorf("restore the Kafka cluster: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.waitInSync(ctx, nil); err != nil {
		c.tb.Errorf("restore the Kafka cluster: %v", err)
	}
}
