package policy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/policy"
)

const maxAmount int64 = policy.MaxAmount

// maxWindowS is policy.MaxBucketWindow in seconds.
var maxWindowS = int64(policy.MaxBucketWindow / time.Second)

// boundCases are limits with one number at its maximum (ok) and one past it (past), and the
// field the refusal must name.
var boundCases = []struct {
	field    string
	ok, past policy.Limit
}{
	{"burst", policy.Limit{RatePerS: 1e6, Burst: maxAmount}, policy.Limit{RatePerS: 1e7, Burst: maxAmount + 1}},
	{"rate_per_s", policy.Limit{RatePerS: 1e15, Burst: 10}, policy.Limit{RatePerS: 1e15 + 1, Burst: 10}},
	{"burst / rate_per_s", policy.Limit{RatePerS: 1e-3, Burst: 1_000_000}, policy.Limit{RatePerS: 1e-3, Burst: 1_000_001}},
	{"window_s", policy.Limit{Limit: 5, WindowS: maxWindowS}, policy.Limit{Limit: 5, WindowS: maxWindowS + 1}},
	{"limit", policy.Limit{Limit: maxAmount, WindowS: 60}, policy.Limit{Limit: maxAmount + 1, WindowS: 60}},
	{"limit", policy.Limit{Algorithm: policy.SlidingWindow, Limit: maxAmount, WindowS: 60}, policy.Limit{Algorithm: policy.SlidingWindow, Limit: maxAmount + 1, WindowS: 60}},
	{"quota", policy.Limit{Quota: ptr(maxAmount)}, policy.Limit{Quota: ptr(maxAmount + 1)}},
	{"quota", policy.Limit{Quota: ptr(maxAmount), QuotaPeriod: policy.Day}, policy.Limit{Quota: ptr(maxAmount + 1), QuotaPeriod: policy.Day}},
	{"ceiling", policy.Limit{RatePerS: 1, Burst: 10, Ceiling: maxAmount}, policy.Limit{RatePerS: 1, Burst: 10, Ceiling: maxAmount + 1}},
}

// Every number of a limit has a maximum: at it the limit is valid, one past it is refused
// with the field named.
func TestLimitBounds(t *testing.T) {
	t.Parallel()
	for _, c := range boundCases {
		require.NoError(t, c.ok.Normalize().Validate(), "%s at its maximum", c.field)
		err := c.past.Normalize().Validate()
		require.Error(t, err, "%s past its maximum", c.field)
		require.Contains(t, err.Error(), c.field+" ")
		require.Contains(t, err.Error(), "at most")
	}
}

// Through the store: an account's overrides and a plan's limits, grants, prices and alert
// thresholds at their maximum are written; one past it is an *InvalidError naming the
// field, and nothing is written.
func TestStoreBounds(t *testing.T) {
	t.Parallel()
	b := planBundle(t)
	org := b.id("org")
	b.create(t, policy.Account{ID: org, Kind: policy.Org})
	for i, c := range boundCases {
		team := b.id("team-" + string(rune('a'+i)))
		for _, l := range []policy.Limit{c.ok, c.past} {
			_, err := b.store.CreateAccount(b.ctx, policy.Account{ID: team, Kind: policy.Team, Parent: org,
				Limits: map[policy.Unit]policy.Limit{policy.Tokens: l}})
			if l == c.ok {
				require.NoError(t, err, "%s at its maximum", c.field)
				continue
			}
			requireInvalid(t, err, "limits")
			require.Contains(t, err.Error(), "limits: tokens: ")
			require.Contains(t, err.Error(), c.field+" ")
		}
		// An update is checked the same way.
		_, err := b.store.UpdateAccount(b.ctx, policy.Account{ID: team, Limits: map[policy.Unit]policy.Limit{policy.Tokens: c.past}})
		requireInvalid(t, err, "limits")
		a, err := b.store.GetAccount(b.ctx, team)
		require.NoError(t, err)
		require.Equal(t, c.ok.Normalize(), a.Limits[policy.Tokens], "the refused update changed nothing")
	}

	// A plan: limits, a grant and every number of a price.
	plan := func() (policy.Plan, *invoice.Plan) {
		return policy.Plan{ID: "big", Rank: 10, Limits: map[policy.Unit]policy.Limit{policy.Tokens: {RatePerS: 1e6, Burst: maxAmount, Quota: ptr(maxAmount)}},
				Grants: map[policy.Unit]policy.PlanGrant{policy.Credits: {Amount: maxAmount}}},
			&invoice.Plan{Currency: "EUR", BaseFeeMinor: maxAmount, Units: []invoice.UnitPrice{{Unit: "tokens", Included: maxAmount - 2,
				Tiers: []invoice.Tier{{From: maxAmount - 2, UpTo: maxAmount, PriceMinor: maxAmount, PerUnits: maxAmount}, {From: maxAmount, PriceMinor: 1, PerUnits: 1}}}}}
	}
	for _, c := range []struct {
		field, message string
		change         func(p *policy.Plan, pr *invoice.Plan)
	}{
		{"limits", "tokens: quota", func(p *policy.Plan, _ *invoice.Plan) {
			p.Limits[policy.Tokens] = policy.Limit{Quota: ptr(maxAmount + 1)}
		}},
		{"grants", "credits: amount", func(p *policy.Plan, _ *invoice.Plan) {
			p.Grants[policy.Credits] = policy.PlanGrant{Amount: maxAmount + 1}
		}},
		{"price.base_fee_minor", "price.base_fee_minor", func(_ *policy.Plan, pr *invoice.Plan) { pr.BaseFeeMinor = maxAmount + 1 }},
		{"price.units", "price.units.tokens.included", func(_ *policy.Plan, pr *invoice.Plan) { pr.Units[0].Included = maxAmount + 1 }},
		{"price.units", "price.units.tokens.tiers[1].from", func(_ *policy.Plan, pr *invoice.Plan) { pr.Units[0].Tiers[1].From = maxAmount + 1 }},
		{"price.units", "price.units.tokens.tiers[0].up_to", func(_ *policy.Plan, pr *invoice.Plan) { pr.Units[0].Tiers[0].UpTo = maxAmount + 1 }},
		{"price.units", "price.units.tokens.tiers[0].price_minor", func(_ *policy.Plan, pr *invoice.Plan) { pr.Units[0].Tiers[0].PriceMinor = maxAmount + 1 }},
		{"price.units", "price.units.tokens.tiers[1].per_units", func(_ *policy.Plan, pr *invoice.Plan) { pr.Units[0].Tiers[1].PerUnits = maxAmount + 1 }},
	} {
		p, pr := plan()
		c.change(&p, pr)
		_, err := b.store.CreatePlan(b.ctx, p, pr)
		requireInvalid(t, err, c.field)
		require.Contains(t, err.Error(), c.message)
		require.Contains(t, err.Error(), "1000000000000000")
	}
	_, err := b.store.GetPlan(b.ctx, "big")
	require.ErrorIs(t, err, policy.ErrNotFound, "no refused plan was written")
	p, pr := plan()
	_, err = b.store.CreatePlan(b.ctx, p, pr)
	require.NoError(t, err, "every number at its maximum")
	pr.EffectivePeriod, pr.BaseFeeMinor = time.Date(2099, time.January, 1, 0, 0, 0, 0, time.UTC), maxAmount+1
	_, err = b.store.UpdatePlan(b.ctx, p, pr)
	requireInvalid(t, err, "price.base_fee_minor")

	// An alert's balance threshold.
	rule := policy.AlertRule{Account: org, Alert: policy.Alert{Kind: policy.BalanceBelow, Unit: policy.Credits, Thresholds: []int64{maxAmount + 1}}}
	_, err = b.store.CreateAlert(b.ctx, rule)
	requireInvalid(t, err, "thresholds")
	rule.Thresholds = []int64{maxAmount}
	_, err = b.store.CreateAlert(b.ctx, rule)
	require.NoError(t, err)
}
