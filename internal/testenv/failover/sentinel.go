// Package failover hands a test the local stack's replicated setups whose nodes it may
// kill: the Redis Sentinel setup (`make up-sentinel`) and the 3-node Kafka cluster (`make
// up-kafka-cluster`). What a test killed is started again through deploy/local/stack.sh
// when it ends, for the next test. There is no container fallback: without the setup the
// test is skipped, or fails under METERGATE_REQUIRE_SERVICES=1 (testenv.Unavailable).
package failover

import (
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
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/testenv"
)

// Sentinel is the test Redis Sentinel setup (`make up-sentinel`): the sentinels and the
// name of the primary they watch.
type Sentinel struct {
	Addrs  []string
	Master string
}

// sentinelAddrsEnv and sentinelMasterEnv name the test Sentinel setup in .run/env. They are
// not the binaries' REDIS_SENTINEL_ADDRS and REDIS_SENTINEL_MASTER: a shell that sourced
// .run/env has REDIS_URL too, which the binaries refuse beside a Sentinel (Env gives a
// process the binaries' settings).
const (
	sentinelAddrsEnv  = "METERGATE_TEST_SENTINEL_ADDRS"
	sentinelMasterEnv = "METERGATE_TEST_SENTINEL_MASTER"
)

// RedisSentinel returns the Sentinel setup of METERGATE_TEST_SENTINEL_ADDRS and
// METERGATE_TEST_SENTINEL_MASTER once a sentinel names a primary that answers PING. There
// is no container fallback: `make up-sentinel` starts one. A test that kills the primary
// owns the setup while it runs: only one such test runs at a time.
func RedisSentinel(tb testing.TB) Sentinel {
	tb.Helper()
	addrs, master := os.Getenv(sentinelAddrsEnv), os.Getenv(sentinelMasterEnv)
	if addrs == "" || master == "" {
		testenv.Unavailable(tb, "Redis Sentinel", sentinelAddrsEnv+" and "+sentinelMasterEnv, "unset")
	}
	s := Sentinel{Addrs: strings.Split(addrs, ","), Master: master}
	ctx := testenv.Context(tb, 10*time.Second)
	primary, err := s.primary(ctx)
	if err != nil {
		testenv.Unavailable(tb, "Redis Sentinel", sentinelAddrsEnv, err.Error())
	}
	c := redis.NewClient(&redis.Options{Addr: primary})
	defer func() { _ = c.Close() }()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Unavailable(tb, "Redis Sentinel", sentinelAddrsEnv, fmt.Sprintf("primary %s: %v", primary, err))
	}
	return s
}

// Env is the settings that send a binary to the setup's primary: the sentinels, and a
// REDIS_URL that names no server (the binaries refuse one that does beside them).
func (s Sentinel) Env() []string {
	return []string{"REDIS_URL=", "REDIS_CLUSTER_ADDRS=",
		"REDIS_SENTINEL_ADDRS=" + strings.Join(s.Addrs, ","), "REDIS_SENTINEL_MASTER=" + s.Master}
}

// primary returns the address of the primary as the first sentinel that answers names it.
func (s Sentinel) primary(ctx context.Context) (string, error) {
	var errs []error
	for _, a := range s.Addrs {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: time.Second, ReadTimeout: time.Second})
		hp, err := sc.GetMasterAddrByName(ctx, s.Master).Result()
		_ = sc.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		errs = append(errs, fmt.Errorf("sentinel %s: %w", a, err))
	}
	return "", errors.Join(errs...)
}

// WaitPromotion polls the sentinels until they name a primary other than old, and returns it.
func (s Sentinel) WaitPromotion(ctx context.Context, old string) (string, error) {
	for {
		p, err := s.primary(ctx)
		if err == nil && p != old {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the sentinels still name %s: %w", old, errors.Join(ctx.Err(), err))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// KillPrimaryCut SIGKILLs the primary (a local process, found by the pid its INFO
// reports) with the replicas left behind first, and returns its address: the primary
// refuses new connections (maxclients 1: the open ones stay), drops the replicas' links
// (CLIENT KILL TYPE replica) and is killed lag later, so that what it wrote in the last lag
// is on no replica: asynchronous replication's loss window, made wide (lag 0 kills it at
// once). When the test ends, `deploy/local/stack.sh up-sentinel` (in the killed server's
// stack state) starts it again as a replica of the promoted one and waits until the setup
// has its replicas and three sentinels again.
func (s Sentinel) KillPrimaryCut(tb testing.TB, lag time.Duration) string {
	tb.Helper()
	ctx := testenv.Context(tb, 30*time.Second)
	primary, err := s.primary(ctx)
	if err != nil {
		tb.Fatalf("find the primary: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: primary})
	defer func() { _ = c.Close() }()
	info := c.InfoMap(ctx, "server")
	if err := info.Err(); err != nil {
		tb.Fatalf("INFO of the primary %s: %v", primary, err)
	}
	pid, err := strconv.Atoi(info.Item("Server", "process_id"))
	if err != nil {
		tb.Fatalf("the primary %s reports no process_id: %v", primary, err)
	}
	dir, err := c.ConfigGet(ctx, "dir").Result()
	if err != nil {
		tb.Fatalf("CONFIG GET dir of the primary %s: %v", primary, err)
	}
	replicas, err := s.Replicas(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	_, primaryPort, _ := net.SplitHostPort(primary)
	dataPorts := []string{primaryPort}
	for _, r := range replicas {
		_, p, _ := net.SplitHostPort(r)
		dataPorts = append(dataPorts, p)
	}
	var sentinelPorts []string
	for _, a := range s.Addrs {
		_, p, _ := net.SplitHostPort(a)
		sentinelPorts = append(sentinelPorts, p)
	}
	// The stack keeps each server's files in <run>/redis-sentinel/<port>.
	run := filepath.Dir(filepath.Dir(dir["dir"]))
	tb.Cleanup(func() {
		script, err := testenv.StackScript()
		if err != nil {
			tb.Errorf("restart the killed primary: %v", err)
			return
		}
		cmd := exec.Command("bash", script, "up-sentinel")
		cmd.Env = append(os.Environ(), "METERGATE_RUN_DIR="+run,
			"REDIS_SENTINEL_DATA_PORTS="+strings.Join(dataPorts, " "), "REDIS_SENTINEL_PORTS="+strings.Join(sentinelPorts, " "))
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Errorf("restart the killed primary (stack.sh up-sentinel): %v\n%s", err, out)
		}
	})
	if lag > 0 {
		// New connections are refused from now on (those open stay), so the replicas
		// cannot come back once their links are dropped.
		if err := c.ConfigSet(ctx, "maxclients", "1").Err(); err != nil {
			tb.Fatalf("CONFIG SET maxclients on %s: %v", primary, err)
		}
		if err := c.ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
			tb.Fatalf("drop the replicas' links of %s: %v", primary, err)
		}
		time.Sleep(lag)
		info := c.InfoMap(ctx, "replication")
		if err := info.Err(); err != nil {
			tb.Fatalf("INFO replication of %s: %v", primary, err)
		}
		if n := info.Item("Replication", "connected_slaves"); n != "0" {
			tb.Fatalf("%s replicas of %s came back", n, primary)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		tb.Fatalf("SIGKILL the primary %s (pid %d): %v", primary, pid, err)
	}
	return primary
}

// Replicas returns the addresses of the replicas the sentinels know of (a killed primary
// stays among them, as a replica that is down).
func (s Sentinel) Replicas(ctx context.Context) ([]string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addrs[0]})
	defer func() { _ = sc.Close() }()
	replicas, err := sc.Replicas(ctx, s.Master).Result()
	if err != nil {
		return nil, fmt.Errorf("the replicas of %s: %w", s.Master, err)
	}
	if len(replicas) == 0 {
		return nil, fmt.Errorf("the sentinels know no replica of %s", s.Master)
	}
	out := make([]string, len(replicas))
	for i, r := range replicas {
		out[i] = net.JoinHostPort(r["ip"], r["port"])
	}
	sort.Strings(out)
	return out, nil
}
