package main

import (
	"context"
	"fmt"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/sandbox"
)

// alerts measures what alert rules cost Redis (issue 19: "Redis CPU per decision with
// alert rules within 5 % of the same decision without"): the bench's decision with, at
// every level with a quota, a rule of 50, 80 and 100 % of it, against the same decision
// without rules, in interleaved samples (-credits-decisions each, 32 callers of an
// in-process Admitter). The quotas are far from their thresholds, as they are for almost
// every decision: what is measured is the rules' standing cost, not a firing's.
func (s *stack) alerts(ctx context.Context, res *Results) error {
	pol, err := s.benchPolicy(ctx)
	if err != nil {
		return err
	}
	prefix := s.cfg.KeyPrefix + "-alerts"
	adm := admission.New(s.rdb, admission.Options{KeyPrefix: prefix, Shards: shards})
	defer adm.Close()
	defer func() { _, _ = sandbox.DeleteKeys(context.WithoutCancel(ctx), s.rdb, prefix) }()

	withRules := pol
	withRules.Path = append([]policy.Level(nil), pol.Path...)
	rules := 0
	for i, lv := range withRules.Path {
		for u, l := range lv.Limits {
			if l.HasQuota() {
				withRules.Path[i].Alerts = append(withRules.Path[i].Alerts,
					policy.Alert{Kind: policy.QuotaPercent, Unit: u, Period: l.QuotaPeriod, Thresholds: []int64{50, 80, 100}})
				rules++
			}
		}
	}
	if rules == 0 {
		return fmt.Errorf("the bench policy has no quota to watch")
	}
	withRules.Stamp = policy.NewStamp()
	pol.Stamp = policy.NewStamp()

	// Each round takes both in turn, in an order that alternates, so that a drift of the
	// server (the outbox grows: no relay reads the prefix) falls on both alike.
	var without, with, ratio, scriptRatio, callsWithout, callsWith []float64
	for r := range s.cfg.Rounds {
		var a, b cost
		for i := range 2 {
			p, out := pol, &a
			if (i+r)%2 == 1 {
				p, out = withRules, &b
			}
			if *out, err = s.decisionCost(ctx, adm, p, s.cfg.CreditsDecisions); err != nil {
				return err
			}
		}
		without, with = append(without, a.cpu), append(with, b.cpu)
		ratio, scriptRatio = append(ratio, b.cpu/a.cpu), append(scriptRatio, b.script/a.script)
		callsWithout, callsWith = append(callsWithout, a.calls), append(callsWith, b.calls)
	}
	res.addSpread("alerts_redis_cost_ratio", spreadOf(ratio), "×", "≤ 1.05",
		fmt.Sprintf("Redis CPU per decision with %d alert rules of 50/80/100 %% (one per quota of the path) ÷ the same decision without, %d decisions of 32 callers per sample, each round's pair; with %v µs, without %v µs (medians)",
			rules, s.cfg.CreditsDecisions, round(spreadOf(with).Median), round(spreadOf(without).Median)))
	res.addSpread("alerts_script_time_ratio", spreadOf(scriptRatio), "×", "",
		fmt.Sprintf("the same pairs' script time per decision (INFO commandstats: EVALSHA's usec, which leaves out reading requests and writing replies); script calls per decision %v with, %v without (medians)",
			round(spreadOf(callsWith).Median), round(spreadOf(callsWithout).Median)))
	return nil
}
