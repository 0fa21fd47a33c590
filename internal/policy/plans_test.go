package policy_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// planBundle is a schema of the test's own: plans are global to a schema, and the
// package schema's tests count the seed plans.
func planBundle(t *testing.T) *testBundle {
	t.Helper()
	pool := migratedSchema(t)
	return &testBundle{ctx: testenv.Context(t, 2*time.Minute), pool: pool, store: policy.NewStore(pool),
		cache: policy.NewCache(pool, quietLog(), time.Minute), name: testenv.Name(t)}
}

func teamPlan() policy.Plan {
	return policy.Plan{ID: "team", Rank: 10, Concurrency: 5, Priority: 40, Limits: map[policy.Unit]policy.Limit{
		policy.Requests: {RatePerS: 50, Burst: 100, Quota: ptr[int64](1_000_000), QuotaPeriod: policy.Month},
		policy.Tokens:   {RatePerS: 10, Burst: 100, Ceiling: 400},
	}}
}

func teamPrice(from time.Time, baseFee int64) *invoice.Plan {
	return &invoice.Plan{EffectivePeriod: from, Currency: "EUR", BaseFeeMinor: baseFee, Units: []invoice.UnitPrice{
		{Unit: "tokens", Included: 1000, Tiers: []invoice.Tier{
			{From: 1000, UpTo: 10_000, PriceMinor: 2, PerUnits: 100}, {From: 10_000, PriceMinor: 1, PerUnits: 100}}},
	}}
}

func requireInvalid(t *testing.T, err error, field string) {
	t.Helper()
	var inv *policy.InvalidError
	require.True(t, errors.As(err, &inv), "an *InvalidError, got %v", err)
	require.Equal(t, field, inv.Field, "%v", err)
}

func TestCreatePlan(t *testing.T) {
	t.Parallel()
	b := planBundle(t)
	p, err := b.store.CreatePlan(b.ctx, teamPlan(), teamPrice(time.Time{}, 1900))
	require.NoError(t, err)
	require.Equal(t, 10, p.Rank)
	require.Equal(t, 5, p.Concurrency)
	require.Equal(t, 40, p.Priority)
	require.Equal(t, teamPlan().Limits[policy.Tokens].Normalize(), p.Limits[policy.Tokens])
	require.Len(t, p.Prices, 1)
	require.Equal(t, 1, p.Prices[0].Version)
	require.True(t, p.Prices[0].EffectivePeriod.IsZero(), "a first price applies from the start")
	require.Equal(t, teamPrice(time.Time{}, 0).Units, p.Prices[0].Units)

	got, err := b.store.GetPlan(b.ctx, "team")
	require.NoError(t, err)
	require.Equal(t, p, got)
	plans, err := b.store.Plans(b.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"free", "pro", "enterprise", "team"}, []string{plans[0].ID, plans[1].ID, plans[2].ID, plans[3].ID})
	require.Equal(t, p, plans[3])
	require.Len(t, plans[1].Prices, 1, "the seeded prices are version 1")

	_, err = b.store.CreatePlan(b.ctx, teamPlan(), nil)
	require.ErrorIs(t, err, policy.ErrExists)
	dup := teamPlan()
	dup.ID = "team2"
	_, err = b.store.CreatePlan(b.ctx, dup, nil)
	requireInvalid(t, err, "rank")

	// Without a price: fine above the smallest plan; the smallest must have one.
	noPrice := teamPlan()
	noPrice.ID, noPrice.Rank = "bare", 20
	_, err = b.store.CreatePlan(b.ctx, noPrice, nil)
	require.NoError(t, err)
	noPrice.ID, noPrice.Rank = "trial", -1
	_, err = b.store.CreatePlan(b.ctx, noPrice, nil)
	requireInvalid(t, err, "price")
	_, err = b.store.GetPlan(b.ctx, "trial")
	require.ErrorIs(t, err, policy.ErrNotFound, "nothing of a refused plan is written")
	_, err = b.store.GetPlan(b.ctx, "nope")
	require.ErrorIs(t, err, policy.ErrNotFound)
}

func TestPlanInvalid(t *testing.T) {
	t.Parallel()
	b := planBundle(t)
	for _, tc := range []struct {
		name, field string
		change      func(p *policy.Plan, price *invoice.Plan)
	}{
		{"bad id", "id", func(p *policy.Plan, _ *invoice.Plan) { p.ID = "a b" }},
		{"priority", "priority", func(p *policy.Plan, _ *invoice.Plan) { p.Priority = 101 }},
		{"concurrency", "concurrency", func(p *policy.Plan, _ *invoice.Plan) { p.Concurrency = -1 }},
		{"rank", "rank", func(p *policy.Plan, _ *invoice.Plan) { p.Rank = 1 << 40 }},
		{"unknown unit", "limits", func(p *policy.Plan, _ *invoice.Plan) {
			p.Limits["apples"] = policy.Limit{RatePerS: 1, Burst: 1}
		}},
		{"rate without burst", "limits", func(p *policy.Plan, _ *invoice.Plan) {
			p.Limits[policy.Requests] = policy.Limit{RatePerS: 1}
		}},
		{"ceiling below burst", "limits", func(p *policy.Plan, _ *invoice.Plan) {
			p.Limits[policy.Tokens] = policy.Limit{RatePerS: 10, Burst: 100, Ceiling: 50}
		}},
		{"currency", "price.currency", func(_ *policy.Plan, pr *invoice.Plan) { pr.Currency = "eur" }},
		{"base fee", "price.base_fee_minor", func(_ *policy.Plan, pr *invoice.Plan) { pr.BaseFeeMinor = -1 }},
		{"tiers", "price.units", func(_ *policy.Plan, pr *invoice.Plan) { pr.Units[0].Tiers[1].From = 9000 }},
		{"first price dated", "price.effective_period", func(_ *policy.Plan, pr *invoice.Plan) {
			pr.EffectivePeriod = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, price := teamPlan(), teamPrice(time.Time{}, 1900)
			p.ID = "p-" + testenv.Name(t)[len(testenv.Name(t))-8:]
			tc.change(&p, price)
			_, err := b.store.CreatePlan(b.ctx, p, price)
			requireInvalid(t, err, tc.field)
		})
	}
	plans, err := b.store.Plans(b.ctx)
	require.NoError(t, err)
	require.Len(t, plans, 3, "no refused plan was written")
}

// An update replaces the limits, rank, concurrency and priority, and adds a price version;
// the cache follows within a second; a version effective in a closed period is refused.
func TestUpdatePlan(t *testing.T) {
	t.Parallel()
	b := planBundle(t)
	_, err := b.store.CreatePlan(b.ctx, teamPlan(), teamPrice(time.Time{}, 1900))
	require.NoError(t, err)
	b.create(t, policy.Account{ID: "acme", Kind: policy.Org, Plan: "team"})
	b.run(t)
	require.Equal(t, int64(100), b.resolve(t, "acme").Path[0].Limits[policy.Requests].Burst)

	up := teamPlan()
	up.Rank, up.Concurrency, up.Priority = 11, 7, 90
	up.Limits = map[policy.Unit]policy.Limit{policy.Requests: {RatePerS: 500, Burst: 1000}}
	dec := time.Date(2026, time.December, 1, 0, 0, 0, 0, time.UTC)
	p, err := b.store.UpdatePlan(b.ctx, up, teamPrice(dec, 2900))
	require.NoError(t, err)
	require.Equal(t, 11, p.Rank)
	require.Equal(t, 90, p.Priority)
	require.Equal(t, map[policy.Unit]policy.Limit{policy.Requests: up.Limits[policy.Requests].Normalize()}, p.Limits)
	require.Len(t, p.Prices, 2)
	require.Equal(t, 2, p.Prices[1].Version)
	require.True(t, p.Prices[1].EffectivePeriod.Equal(dec))
	require.Equal(t, int64(1900), p.Prices[0].BaseFeeMinor, "version 1 is kept")

	eventually(t, time.Second, "the cache has the plan's new limits", func() bool {
		r, err := b.cache.Resolve("acme")
		return err == nil && r.Path[0].Limits[policy.Requests].Burst == 1000 && r.Priority == 90
	})

	// Without a price, the prices stay; a closed period cannot take a new one.
	p, err = b.store.UpdatePlan(b.ctx, up, nil)
	require.NoError(t, err)
	require.Len(t, p.Prices, 2)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO periods (period, closed_at, closed_by) VALUES ('2026-12-01', now(), 'test')`)
	require.NoError(t, err)
	_, err = b.store.UpdatePlan(b.ctx, up, teamPrice(dec, 3900))
	requireInvalid(t, err, "price.effective_period")
	_, err = b.store.UpdatePlan(b.ctx, up, teamPrice(time.Time{}, 3900))
	requireInvalid(t, err, "price.effective_period")
	p, err = b.store.UpdatePlan(b.ctx, up, teamPrice(dec.AddDate(0, 1, 0), 3900))
	require.NoError(t, err)
	require.Len(t, p.Prices, 3)

	up.ID = "nope"
	_, err = b.store.UpdatePlan(b.ctx, up, nil)
	require.ErrorIs(t, err, policy.ErrNotFound)
	up.ID, up.Rank = "team", 1
	_, err = b.store.UpdatePlan(b.ctx, up, nil)
	requireInvalid(t, err, "rank")
}
