package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
)

// waitersN is how many requests wait in the waiters measurement (issue 17: "measure
// Redis CPU with 1,000 waiters").
const waitersN = 1000

// waiters measures what waiting requests cost Redis: its CPU and script calls per second
// while 1,000 requests wait (max_wait_ms) on two admit nodes for one limit whose turn does
// not come during the sample, against the same Redis with none waiting, in interleaved
// samples (none, waiting, none, waiting, …) of -duration each. The nodes are in-process Admitters, each
// with its own connections, as two admit processes would be.
func (s *stack) waiters(ctx context.Context, res *Results) error {
	prefix := s.cfg.KeyPrefix + "-wait"
	nodes := make([]*admission.Admitter, 2)
	regs := make([]*prometheus.Registry, 2)
	for i := range nodes {
		regs[i] = prometheus.NewRegistry()
		nodes[i] = admission.New(s.rdb, admission.Options{KeyPrefix: prefix, Registerer: regs[i]})
		defer nodes[i].Close()
	}
	// One request every two minutes: after the first, everyone waits for the next.
	org := "bench-waiters"
	pol := policy.Resolved{Org: org, Plan: "bench", Path: []policy.Level{{Account: org, Kind: policy.Org,
		Limits: map[policy.Unit]policy.Limit{policy.Requests: policy.Limit{RatePerS: 1.0 / 120, Burst: 1}.Normalize()}}}}
	one := map[policy.Unit]int64{policy.Requests: 1}
	if _, err := nodes[0].Decide(ctx, admission.Request{EventID: nodes[0].NewEventID(org), Units: one, Policy: pol, Source: "bench"}); err != nil {
		return err
	}

	sample := func(wait bool) (cpuMSPerS, callsPerS float64, err error) {
		wctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		if wait {
			for i := range waitersN {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n := nodes[i%2]
					_, _ = n.Decide(wctx, admission.Request{EventID: n.NewEventID(org), Units: one, Policy: pol,
						Source: "bench", MaxWait: 10 * time.Minute})
				}()
			}
			// Every request has had its first call and waits: the gauge says so, and the
			// calls of the joining have passed (a second, the nodes' poll period).
			deadline := time.Now().Add(time.Minute)
			for waiting(regs) < waitersN {
				if time.Now().After(deadline) {
					return 0, 0, fmt.Errorf("%v of %d requests waiting after a minute", waiting(regs), waitersN)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		time.Sleep(time.Second)
		cpu0, err := s.redisCPU(ctx)
		if err != nil {
			return 0, 0, err
		}
		cs0, err := s.commandStats(ctx)
		if err != nil {
			return 0, 0, err
		}
		start := time.Now()
		time.Sleep(s.cfg.Duration)
		cpu1, err := s.redisCPU(ctx)
		if err != nil {
			return 0, 0, err
		}
		cs1, err := s.commandStats(ctx)
		if err != nil {
			return 0, 0, err
		}
		took := time.Since(start).Seconds()
		c0, _ := scriptCalls(cs0)
		c1, _ := scriptCalls(cs1)
		return float64((cpu1 - cpu0).Microseconds()) / 1000 / took, (c1 - c0) / took, nil
	}

	var rounds []map[string]float64
	var idleCPU, waitCPU, waitCalls, idleCalls []float64
	for range s.cfg.Rounds {
		ic, icalls, err := sample(false)
		if err != nil {
			return err
		}
		wc, wcalls, err := sample(true)
		if err != nil {
			return err
		}
		idleCPU, waitCPU = append(idleCPU, ic), append(waitCPU, wc)
		idleCalls, waitCalls = append(idleCalls, icalls), append(waitCalls, wcalls)
		rounds = append(rounds, map[string]float64{"idle_cpu_ms_per_s": ic, "waiting_cpu_ms_per_s": wc,
			"idle_script_calls_per_s": icalls, "waiting_script_calls_per_s": wcalls})
	}
	res.Raw["waiters_rounds"] = rounds
	extra, calls := make([]float64, len(idleCPU)), make([]float64, len(idleCalls))
	for i := range idleCPU {
		extra[i], calls[i] = waitCPU[i]-idleCPU[i], waitCalls[i]-idleCalls[i]
	}
	res.addSpread("waiters_1000_redis_cpu_ms_per_s", spreadOf(extra), "ms/s", "",
		fmt.Sprintf("Redis CPU per second with %d requests waiting on two nodes, less the same Redis with none (%v samples; idle: %v ms/s)",
			waitersN, s.cfg.Duration, round(spreadOf(idleCPU).Median)))
	res.addSpread("waiters_1000_script_calls_per_s", spreadOf(calls), "calls/s", "≤ 10",
		fmt.Sprintf("script calls per second with %d requests waiting on two nodes, less none waiting: per queue and node, not per waiter (a poll per waiter a second would be %d)",
			waitersN, waitersN))
	return nil
}

// waiting sums the nodes' metergate_admit_waiting_requests.
func waiting(regs []*prometheus.Registry) float64 {
	var n float64
	for _, r := range regs {
		mfs, err := r.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() == "metergate_admit_waiting_requests" {
				for _, m := range mf.GetMetric() {
					n += gauge(m)
				}
			}
		}
	}
	return n
}

func gauge(m *dto.Metric) float64 { return m.GetGauge().GetValue() }
