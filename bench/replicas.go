package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/sandbox"
)

// replicas measures what ADMIT_REDIS_WAIT_REPLICAS=1 costs: two admit nodes on the Sentinel
// setup of `make up-sentinel` (a primary and two replicas on the same machine), one sending
// WAIT 1 with every script call and one not, the same decision through POST /v1/admit of
// each, in interleaved rounds: decisions/s and admit CPU with cfg.Clients closed loops, and
// the idle p50 added (1 client). The replicas are local: a network round trip to a replica
// elsewhere adds its own latency to every decision.
func (s *stack) replicas(ctx context.Context, res *Results) error {
	// The test setup's own names (.run/env): the binaries refuse REDIS_URL beside
	// REDIS_SENTINEL_ADDRS, so the stack does not export those.
	addrs, master := os.Getenv("METERGATE_TEST_SENTINEL_ADDRS"), os.Getenv("METERGATE_TEST_SENTINEL_MASTER")
	if addrs == "" || master == "" {
		return errors.New("METERGATE_TEST_SENTINEL_ADDRS and METERGATE_TEST_SENTINEL_MASTER unset: run `make up-sentinel` and `. .run/env`")
	}
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: strings.Split(addrs, ",")})
	defer func() { _ = rdb.Close() }()
	defer func() { _, _ = sandbox.DeleteKeys(context.WithoutCancel(ctx), rdb, s.cfg.KeyPrefix+"-replicas") }()
	key, err := s.createTree(ctx, renamedTree("rep-"))
	if err != nil {
		return err
	}
	var paths []gatewayPath
	pids := map[string]int{}
	for _, n := range []struct{ name, wait string }{{"async", "0"}, {"wait1", "1"}} {
		addr, err := sandbox.FreeAddr()
		if err != nil {
			return err
		}
		env := append(append([]string{}, s.env...), "ADMIT_ADDR="+addr, "ADMIT_NODE=bench-replicas-"+n.name,
			"REDIS_TIMEOUT=5s", "ADMIT_SERVICE_TOKEN="+serviceToken, "ADMIT_ADMIN_TOKEN="+adminToken,
			"ADMIT_KEY_PREFIX="+s.cfg.KeyPrefix+"-replicas", "REDIS_URL=", "REDIS_CLUSTER_ADDRS=",
			"REDIS_SENTINEL_ADDRS="+addrs, "REDIS_SENTINEL_MASTER="+master, "ADMIT_REDIS_WAIT_REPLICAS="+n.wait)
		p, err := sandbox.StartAs(s.cfg.BinDir, s.cfg.LogDir, "admit", "replicas-"+n.name, addr, env)
		if err != nil {
			return err
		}
		defer func() { _ = p.Stop(30 * time.Second) }()
		if err := p.WaitReady(ctx, 2*time.Minute); err != nil {
			return err
		}
		path := s.httpDecision(p.URL(), key)
		path.name = n.name
		if err := retryUntil(ctx, 30*time.Second, path.call); err != nil { // the cache learns the key
			return fmt.Errorf("%s: %w", n.name, err)
		}
		paths = append(paths, path)
		pids[n.name] = p.Pid()
	}

	samples, rounds, err := s.pathRounds(ctx, paths, func(path string) int { return pids[path] })
	if err != nil {
		return err
	}
	res.Raw["replicas_rounds"] = rounds
	base, wait := samples["async"], samples["wait1"]
	var perS, cpu, added []float64
	for i := range base.perS {
		perS = append(perS, wait.perS[i]/base.perS[i])
		cpu = append(cpu, wait.cpu[i]/base.cpu[i])
		added = append(added, wait.p50[i]-base.p50[i])
	}
	what := fmt.Sprintf("POST /v1/admit of an admit node with ADMIT_REDIS_WAIT_REPLICAS=1 and of one without, on the Sentinel setup (a primary, two replicas, all local), %d clients, each round's pair", s.cfg.Clients)
	res.addSpread("replicas_wait_throughput_ratio", spreadOf(perS), "×", "",
		fmt.Sprintf("decisions/s, WAIT 1 ÷ none: %s; %.0f/s against %.0f/s (medians)", what, spreadOf(wait.perS).Median, spreadOf(base.perS).Median))
	res.addSpread("replicas_wait_cpu_ratio", spreadOf(cpu), "×", "",
		fmt.Sprintf("admit CPU per decision, WAIT 1 ÷ none: %s; %.0f µs against %.0f µs (medians)", what, spreadOf(wait.cpu).Median, spreadOf(base.cpu).Median))
	res.addSpread("replicas_wait_p50_ms_idle_added", spreadOf(added), "ms", "",
		fmt.Sprintf("idle p50 (1 client) with WAIT 1 less without; %.3f ms against %.3f ms (medians)", spreadOf(wait.p50).Median, spreadOf(base.p50).Median))
	return nil
}
