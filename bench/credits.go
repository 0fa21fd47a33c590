package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/sandbox"
)

// credits measures what drawing a prepaid balance costs Redis (issue 18: "Redis CPU per
// decision with a balance check within 10 % of the same decision without"): the bench's
// decision (4 levels, requests and tokens buckets, a monthly quota, the outbox event)
// (-credits-decisions per sample) taken by 32 concurrent callers of an in-process Admitter, with and without a balance of
// tokens at the org (one grant, never spent during the run), in interleaved samples. Redis
// CPU is INFO cpu's delta over each sample ÷ its decisions; no relay reads the prefix, so
// only the decisions count.
func (s *stack) credits(ctx context.Context, res *Results) error {
	pol, err := s.benchPolicy(ctx)
	if err != nil {
		return err
	}
	prefix := s.cfg.KeyPrefix + "-credits"
	adm := admission.New(s.rdb, admission.Options{KeyPrefix: prefix, Shards: shards})
	defer adm.Close()
	defer func() { _, _ = sandbox.DeleteKeys(context.WithoutCancel(ctx), s.rdb, prefix) }()

	withCredits := pol
	withCredits.Path = append([]policy.Level(nil), pol.Path...)
	withCredits.Path[0].Credits = []policy.Unit{policy.Tokens}
	withCredits.Stamp = policy.NewStamp()
	pol.Stamp = policy.NewStamp()
	keys := adm.Keys()
	grants := keys.Grants(pol.Org, pol.Org, policy.Tokens)
	if err := s.rdb.HSet(ctx, grants, "gr_00000000000000000000000000000001", int64(1e15)).Err(); err != nil {
		return err
	}
	terms := fmt.Sprintf("0|%d|0", time.Now().Add(-time.Hour).UnixMilli())
	if err := s.rdb.HSet(ctx, keys.GrantTerms(pol.Org, pol.Org, policy.Tokens), "gr_00000000000000000000000000000001", terms).Err(); err != nil {
		return err
	}

	sample := func(p policy.Resolved) (float64, error) {
		c, err := s.decisionCost(ctx, adm, p, s.cfg.CreditsDecisions)
		return c.cpu, err
	}

	var without, with, ratio []float64
	for range s.cfg.Rounds {
		a, err := sample(pol)
		if err != nil {
			return err
		}
		b, err := sample(withCredits)
		if err != nil {
			return err
		}
		without, with, ratio = append(without, a), append(with, b), append(ratio, b/a)
	}
	res.addSpread("credits_redis_cost_ratio", spreadOf(ratio), "×", "≤ 1.1",
		fmt.Sprintf("Redis CPU per decision drawing a balance of tokens at the org (one grant) ÷ the same decision without, %d decisions of 32 callers per sample, each round's pair; with %v µs, without %v µs (medians)",
			s.cfg.CreditsDecisions, round(spreadOf(with).Median), round(spreadOf(without).Median)))
	return nil
}

// cost is what n decisions cost Redis, per decision, µs: its CPU (INFO cpu) and the time
// its script calls took (INFO commandstats), which leaves out reading requests and writing
// replies and so varies less.
type cost struct{ cpu, script, calls float64 }

// decisionCost takes n decisions of p by 32 concurrent callers of adm and returns what they
// cost Redis per decision.
func (s *stack) decisionCost(ctx context.Context, adm *admission.Admitter, p policy.Resolved, n int) (cost, error) {
	cs0, err := s.commandStats(ctx)
	if err != nil {
		return cost{}, err
	}
	cpu0, err := s.redisCPU(ctx)
	if err != nil {
		return cost{}, err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				d, err := adm.Decide(ctx, admission.Request{EventID: adm.NewEventID(p.Org), Policy: p, Units: decisionUnits, Source: "bench"})
				if err == nil && d.Result != admission.Allow {
					err = fmt.Errorf("decision %s", d.Result)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return cost{}, err
	}
	cpu1, err := s.redisCPU(ctx)
	if err != nil {
		return cost{}, err
	}
	cs1, err := s.commandStats(ctx)
	if err != nil {
		return cost{}, err
	}
	var usec float64
	for _, name := range []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"} {
		usec += cs1[name].Usec - cs0[name].Usec
	}
	calls0, _ := scriptCalls(cs0)
	calls1, _ := scriptCalls(cs1)
	return cost{cpu: float64((cpu1 - cpu0).Microseconds()) / float64(n), script: usec / float64(n), calls: (calls1 - calls0) / float64(n)}, nil
}
