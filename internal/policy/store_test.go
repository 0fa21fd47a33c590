package policy_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

type testBundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	store *policy.Store
	cache *policy.Cache // not running: tests call Reload, or run it with b.run
	name  string        // account-id prefix unique to the test
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := testenv.Postgres(t)
	return &testBundle{
		ctx:   testenv.Context(t, 2*time.Minute),
		pool:  pool,
		store: policy.NewStore(pool),
		cache: policy.NewCache(pool, quietLog(), time.Minute),
		name:  testenv.Name(t),
	}
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// id makes an account id unique to the test.
func (b *testBundle) id(name string) string { return b.name + "-" + name }

// run runs the cache until the test ends and waits for its first load.
func (b *testBundle) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.cache.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "Run returns nil when its context ends")
	})
	eventually(t, 5*time.Second, "the cache loads", b.cache.Loaded)
}

func (b *testBundle) reload(t *testing.T) {
	t.Helper()
	require.NoError(t, b.cache.Reload(b.ctx))
}

func (b *testBundle) create(t *testing.T, a policy.Account) policy.Account {
	t.Helper()
	out, err := b.store.CreateAccount(b.ctx, a)
	require.NoError(t, err, "create %s", a.ID)
	return out
}

func (b *testBundle) resolve(t *testing.T, id string) policy.Resolved {
	t.Helper()
	r, err := b.cache.Resolve(id)
	require.NoError(t, err, "resolve %s", id)
	return r
}

// eventually polls cond until it holds or within has passed.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

func ptr[T any](v T) *T { return &v }

func perHour(n int64) policy.Limit { return policy.Limit{Limit: n, WindowS: 3600} }

var seedPlans = map[string]policy.Limit{
	"free":       {Algorithm: policy.TokenBucket, RatePerS: 10, Burst: 20, Quota: ptr[int64](50_000), QuotaPeriod: policy.Month},
	"pro":        {Algorithm: policy.TokenBucket, RatePerS: 100, Burst: 300, Quota: ptr[int64](5_000_000), QuotaPeriod: policy.Month},
	"enterprise": {Algorithm: policy.TokenBucket, RatePerS: 1000, Burst: 2000, Quota: ptr(policy.Uncapped), QuotaPeriod: policy.Month},
}

func TestSeedPlans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	plans, err := b.store.Plans(b.ctx)
	require.NoError(t, err)
	require.Len(t, plans, 3)
	for i, id := range []string{"free", "pro", "enterprise"} {
		p := plans[i]
		require.Equal(t, id, p.ID, "smallest first")
		require.Equal(t, i, p.Rank)
		require.Equal(t, 0, p.Concurrency)
		require.Equal(t, map[policy.Unit]policy.Limit{policy.Requests: seedPlans[id]}, p.Limits, id)
	}
	require.False(t, plans[2].Limits[policy.Requests].HasQuota(), "enterprise is uncapped")
}

// The tree of the seed article: acme (pro) → engineering → alice → agent-1, agent-2; bob
// beside alice; marketing beside engineering.
func TestResolveTree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acme, eng, alice, agent1, agent2, bob, marketing := b.id("acme"), b.id("engineering"), b.id("alice"), b.id("agent-1"), b.id("agent-2"), b.id("bob"), b.id("marketing")

	org := b.create(t, policy.Account{ID: acme, Kind: policy.Org, Plan: "pro", Limits: map[policy.Unit]policy.Limit{policy.Tokens: perHour(1_000_000)}})
	require.Equal(t, acme, org.Org)
	require.Empty(t, org.Parent)
	b.create(t, policy.Account{ID: eng, Kind: policy.Team, Parent: acme, Limits: map[policy.Unit]policy.Limit{policy.Tokens: perHour(500_000)}})
	got := b.create(t, policy.Account{ID: alice, Kind: policy.User, Parent: eng, Limits: map[policy.Unit]policy.Limit{policy.Tokens: perHour(100_000)}})
	require.Equal(t, acme, got.Org, "org comes from the parent")
	for _, id := range []string{agent1, agent2} {
		b.create(t, policy.Account{ID: id, Kind: policy.Agent, Parent: alice, Limits: map[policy.Unit]policy.Limit{policy.Tokens: perHour(25_000)}})
	}
	// bob names a plan of his own and overrides only its rate part; marketing overrides
	// only a quota, with no plan under it.
	b.create(t, policy.Account{ID: bob, Kind: policy.User, Parent: eng, Plan: "free", Concurrency: ptr(2),
		Limits: map[policy.Unit]policy.Limit{policy.Requests: {RatePerS: 5, Burst: 10}, policy.Tokens: perHour(100_000)}})
	b.create(t, policy.Account{ID: marketing, Kind: policy.Team, Parent: acme, Concurrency: ptr(0),
		Limits: map[policy.Unit]policy.Limit{policy.Tokens: perHour(200_000), policy.Credits: {Quota: ptr[int64](1000), QuotaPeriod: policy.Day}}})
	b.reload(t)

	tokens := func(n int64) policy.Limit { return perHour(n).Normalize() }
	r := b.resolve(t, agent1)
	require.Equal(t, acme, r.Org)
	require.Equal(t, "pro", r.Plan)
	require.Equal(t, agent1, r.Account())
	require.Equal(t, []policy.Level{
		{Account: acme, Kind: policy.Org, Plan: "pro", Limits: map[policy.Unit]policy.Limit{policy.Requests: seedPlans["pro"], policy.Tokens: tokens(1_000_000)}},
		{Account: eng, Kind: policy.Team, Limits: map[policy.Unit]policy.Limit{policy.Tokens: tokens(500_000)}},
		{Account: alice, Kind: policy.User, Limits: map[policy.Unit]policy.Limit{policy.Tokens: tokens(100_000)}},
		{Account: agent1, Kind: policy.Agent, Limits: map[policy.Unit]policy.Limit{policy.Tokens: tokens(25_000)}},
	}, r.Path)
	require.InDelta(t, 1_000_000.0/3600, r.Path[0].Limits[policy.Tokens].RatePerS, 1e-9)
	require.True(t, r.HasQuota(), "pro's monthly quota applies at the org")

	require.Equal(t, agent2, b.resolve(t, agent2).Account())
	require.Len(t, b.resolve(t, alice).Path, 3)
	require.Len(t, b.resolve(t, acme).Path, 1)

	// bob: free's quota under his own rate, his own concurrency; the org is still pro.
	r = b.resolve(t, bob)
	require.Equal(t, "pro", r.Plan)
	require.Equal(t, []string{acme, eng, bob}, accounts(r))
	lv := r.Path[2]
	require.Equal(t, "free", lv.Plan)
	require.Equal(t, 2, lv.Concurrency)
	require.Equal(t, policy.Limit{Algorithm: policy.TokenBucket, RatePerS: 5, Burst: 10, Quota: ptr[int64](50_000), QuotaPeriod: policy.Month}, lv.Limits[policy.Requests])
	require.Equal(t, tokens(100_000), lv.Limits[policy.Tokens])

	// marketing: no plan, so only its overrides; a quota-only override has no rate.
	r = b.resolve(t, marketing)
	lv = r.Path[1]
	require.Empty(t, lv.Plan)
	require.Equal(t, 0, lv.Concurrency)
	require.Equal(t, map[policy.Unit]policy.Limit{
		policy.Tokens:  tokens(200_000),
		policy.Credits: {Algorithm: policy.TokenBucket, Quota: ptr[int64](1000), QuotaPeriod: policy.Day},
	}, lv.Limits)
	require.False(t, lv.Limits[policy.Credits].HasRate())

	// The store gives back the node as written, normalized.
	a, err := b.store.GetAccount(b.ctx, alice)
	require.NoError(t, err)
	require.Equal(t, policy.Account{ID: alice, Kind: policy.User, Parent: eng, Org: acme,
		Limits: map[policy.Unit]policy.Limit{policy.Tokens: tokens(100_000)}, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}, a)
	require.False(t, a.CreatedAt.IsZero())
	_, err = b.store.GetAccount(b.ctx, b.id("nobody"))
	require.ErrorIs(t, err, policy.ErrNotFound)
	_, err = b.cache.Resolve(b.id("nobody"))
	require.ErrorIs(t, err, policy.ErrNotFound)
}

func accounts(r policy.Resolved) []string {
	var ids []string
	for _, lv := range r.Path {
		ids = append(ids, lv.Account)
	}
	return ids
}

// Overrides over the org's plan, group by group.
func TestResolveOverlay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	globex, initech, hooli := b.id("globex"), b.id("initech"), b.id("hooli")
	b.create(t, policy.Account{ID: globex, Kind: policy.Org, Plan: "enterprise", Concurrency: ptr(50),
		Limits: map[policy.Unit]policy.Limit{policy.Requests: {Quota: ptr[int64](1000), QuotaPeriod: policy.Day}}})
	b.create(t, policy.Account{ID: initech, Kind: policy.Org, Plan: "free",
		Limits: map[policy.Unit]policy.Limit{policy.Requests: {Algorithm: policy.SlidingWindow, Limit: 10, WindowS: 1800}}})
	b.create(t, policy.Account{ID: hooli, Kind: policy.Org, Plan: "pro",
		Limits: map[policy.Unit]policy.Limit{policy.Requests: {Quota: ptr(policy.Uncapped)}}})
	b.reload(t)

	lv := b.resolve(t, globex).Path[0]
	require.Equal(t, 50, lv.Concurrency)
	require.Equal(t, policy.Limit{Algorithm: policy.TokenBucket, RatePerS: 1000, Burst: 2000, Quota: ptr[int64](1000), QuotaPeriod: policy.Day}, lv.Limits[policy.Requests])

	lv = b.resolve(t, initech).Path[0]
	require.Equal(t, policy.Limit{Algorithm: policy.SlidingWindow, Limit: 10, WindowS: 1800, Quota: ptr[int64](50_000), QuotaPeriod: policy.Month}, lv.Limits[policy.Requests])

	r := b.resolve(t, hooli)
	require.Equal(t, policy.Limit{Algorithm: policy.TokenBucket, RatePerS: 100, Burst: 300, Quota: ptr(policy.Uncapped), QuotaPeriod: policy.Month}, r.Path[0].Limits[policy.Requests])
	require.False(t, r.HasQuota(), "an uncapped override lifts pro's quota")
}

// Unknown or missing plans clamp to the smallest plan, never the largest. Such rows can
// only be written by hand: the store refuses unknown plans.
func TestUnknownPlanClampsToSmallest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown, missing, team := b.id("unknown"), b.id("missing"), b.id("team")
	_, err := b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, org, plan) VALUES ($1, 'org', $1, 'platinum'), ($2, 'org', $2, NULL)`, unknown, missing)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, parent, org, plan) VALUES ($1, 'team', $2, $2, 'gold')`, team, missing)
	require.NoError(t, err)
	b.reload(t)

	free := map[policy.Unit]policy.Limit{policy.Requests: seedPlans["free"]}
	for _, id := range []string{unknown, missing} {
		r := b.resolve(t, id)
		require.Equal(t, "free", r.Plan, id)
		require.Equal(t, "free", r.Path[0].Plan, id)
		require.Equal(t, free, r.Path[0].Limits, id)
	}
	r := b.resolve(t, team)
	require.Equal(t, "free", r.Path[1].Plan, "a team naming an unknown plan gets the smallest")
	require.Equal(t, free, r.Path[1].Limits)

	_, err = b.store.UpdateAccount(b.ctx, policy.Account{ID: missing, Plan: "platinum"})
	var inv *policy.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "plan", inv.Field)
}

// Rows written by hand can break the tree; such accounts are left out (refused), the rest
// still load.
func TestBrokenAncestryIsLeftOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	org, team, user, agent, deep := b.id("org"), b.id("team"), b.id("user"), b.id("agent"), b.id("deep")
	b.create(t, policy.Account{ID: org, Kind: policy.Org, Plan: "pro"})
	b.create(t, policy.Account{ID: team, Kind: policy.Team, Parent: org})
	b.create(t, policy.Account{ID: user, Kind: policy.User, Parent: team})
	b.create(t, policy.Account{ID: agent, Kind: policy.Agent, Parent: user})
	_, err := b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, parent, org) VALUES ($1, 'user', $2, $3)`, deep, agent, org)
	require.NoError(t, err)
	b.reload(t)
	_, err = b.cache.Resolve(deep)
	require.ErrorIs(t, err, policy.ErrNotFound, "a user under an agent")
	require.Len(t, b.resolve(t, agent).Path, 4)

	// A cycle: the team under its own user.
	_, err = b.pool.Exec(b.ctx, `UPDATE accounts SET parent = $1 WHERE id = $2`, user, team)
	require.NoError(t, err)
	b.reload(t)
	for _, id := range []string{team, user, agent, deep} {
		_, err = b.cache.Resolve(id)
		require.ErrorIs(t, err, policy.ErrNotFound, id)
	}
	require.Len(t, b.resolve(t, org).Path, 1)
}

func TestCreateAccountInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	org, team, user, agent := b.id("org"), b.id("team"), b.id("user"), b.id("agent")
	b.create(t, policy.Account{ID: org, Kind: policy.Org, Plan: "free"})
	b.create(t, policy.Account{ID: team, Kind: policy.Team, Parent: org})
	b.create(t, policy.Account{ID: user, Kind: policy.User, Parent: team})
	b.create(t, policy.Account{ID: agent, Kind: policy.Agent, Parent: user})

	newID := b.id("new")
	limit := func(l policy.Limit) map[policy.Unit]policy.Limit {
		return map[policy.Unit]policy.Limit{policy.Tokens: l}
	}
	tests := []struct {
		name    string
		account policy.Account
		field   string
		message string // a part of the message
	}{
		{"space in id", policy.Account{ID: "a b", Kind: policy.Org}, "id", "1-64"},
		{"id starts with a dash", policy.Account{ID: "-a", Kind: policy.Org}, "id", ""},
		{"colon in id (Redis key separator)", policy.Account{ID: "a:b", Kind: policy.Org}, "id", ""},
		{"non-ASCII id", policy.Account{ID: "ünï", Kind: policy.Org}, "id", ""},
		{"empty id", policy.Account{Kind: policy.Org}, "id", ""},
		{"id of 65 characters", policy.Account{ID: strings.Repeat("a", 65), Kind: policy.Org}, "id", ""},
		{"unknown kind", policy.Account{ID: newID, Kind: "division"}, "kind", "unknown kind"},
		{"no kind", policy.Account{ID: newID}, "kind", ""},
		{"org with a parent", policy.Account{ID: newID, Kind: policy.Org, Parent: org}, "parent", "no parent"},
		{"team without a parent", policy.Account{ID: newID, Kind: policy.Team}, "parent", "needs a parent"},
		{"agent under an agent", policy.Account{ID: newID, Kind: policy.Agent, Parent: agent}, "parent", "cannot be under"},
		{"team under a user", policy.Account{ID: newID, Kind: policy.Team, Parent: user}, "parent", "cannot be under"},
		{"user under a user", policy.Account{ID: newID, Kind: policy.User, Parent: user}, "parent", "cannot be under"},
		{"parent missing", policy.Account{ID: newID, Kind: policy.Team, Parent: b.id("ghost")}, "parent", "does not exist"},
		{"parent not an id", policy.Account{ID: newID, Kind: policy.Team, Parent: "x y"}, "parent", "does not exist"},
		{"org not the parent's", policy.Account{ID: newID, Kind: policy.Team, Parent: org, Org: b.id("other")}, "org", ""},
		{"unknown plan", policy.Account{ID: newID, Kind: policy.Org, Plan: "platinum"}, "plan", "unknown plan"},
		{"plan not an id", policy.Account{ID: newID, Kind: policy.Org, Plan: "a b"}, "plan", "unknown plan"},
		{"negative concurrency", policy.Account{ID: newID, Kind: policy.Org, Concurrency: ptr(-1)}, "concurrency", ""},
		{"unknown unit", policy.Account{ID: newID, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{"gpus": perHour(1)}}, "limits", "unknown unit"},
		{"rate without burst", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{RatePerS: 1})}, "limits", "both rate_per_s and burst"},
		{"burst without rate", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{Burst: 1})}, "limits", "both rate_per_s and burst"},
		{"negative rate", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{RatePerS: -1, Burst: 5})}, "limits", "negative"},
		{"infinite rate", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{RatePerS: math.Inf(1), Burst: 5})}, "limits", "finite"},
		{"limit without window", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{Limit: 100})}, "limits", "go together"},
		{"window without limit", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{WindowS: 60})}, "limits", ""},
		{"negative window", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{Limit: 5, WindowS: -60})}, "limits", "negative"},
		{"both bucket forms", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{RatePerS: 1, Burst: 5, Limit: 100, WindowS: 60})}, "limits", "not both"},
		{"unknown algorithm", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{Algorithm: "leaky", RatePerS: 1, Burst: 1})}, "limits", "unknown algorithm"},
		{"sliding window without window", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{Algorithm: policy.SlidingWindow, Limit: 10})}, "limits", "sliding window"},
		{"sliding window over 31 days", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{Algorithm: policy.SlidingWindow, Limit: 10, WindowS: 32 * 86400})}, "limits", "31 days"},
		{"sliding window with a burst", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{Algorithm: policy.SlidingWindow, Limit: 10, WindowS: 60, Burst: 5, RatePerS: 1})}, "limits", "for token_bucket"},
		{"quota below -1", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{Quota: ptr[int64](-2)})}, "limits", "quota"},
		{"unknown quota period", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{Quota: ptr[int64](5), QuotaPeriod: "week"})}, "limits", "quota_period"},
		{"quota period without quota", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{RatePerS: 1, Burst: 1, QuotaPeriod: policy.Day})}, "limits", "needs a quota"},
		{"empty limit", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{})}, "limits", "neither"},
		{"ceiling on an org", policy.Account{ID: newID, Kind: policy.Org, Limits: limit(policy.Limit{RatePerS: 1, Burst: 10, Ceiling: 20})}, "limits", "no parent to borrow from"},
		{"ceiling below the burst", policy.Account{ID: newID, Kind: policy.Team, Parent: org, Limits: limit(policy.Limit{RatePerS: 1, Burst: 10, Ceiling: 5})}, "limits", "at least the burst"},
		{"negative ceiling", policy.Account{ID: newID, Kind: policy.Team, Parent: org, Limits: limit(policy.Limit{RatePerS: 1, Burst: 10, Ceiling: -1})}, "limits", "must not be negative"},
		{"ceiling on a sliding window", policy.Account{ID: newID, Kind: policy.Team, Parent: org, Limits: limit(policy.Limit{Algorithm: policy.SlidingWindow, Limit: 10, WindowS: 60, Ceiling: 20})}, "limits", "needs a token bucket"},
		{"ceiling on a quota alone", policy.Account{ID: newID, Kind: policy.Team, Parent: org, Limits: limit(policy.Limit{Quota: ptr[int64](5), Ceiling: 20})}, "limits", "needs a token bucket"},
		{"priority above 100", policy.Account{ID: newID, Kind: policy.Team, Parent: org, Priority: ptr(101)}, "priority", "0 to 100"},
		{"negative priority", policy.Account{ID: newID, Kind: policy.Org, Priority: ptr(-1)}, "priority", "0 to 100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.store.CreateAccount(b.ctx, tt.account)
			var inv *policy.InvalidError
			require.ErrorAs(t, err, &inv)
			require.Equal(t, tt.field, inv.Field, inv.Error())
			require.Contains(t, inv.Message, tt.message)
			require.Equal(t, inv.Field+": "+inv.Message, inv.Error())
		})
	}
	_, err := b.store.GetAccount(b.ctx, newID)
	require.ErrorIs(t, err, policy.ErrNotFound, "nothing was written")

	// A taken id, whatever the rest says.
	_, err = b.store.CreateAccount(b.ctx, policy.Account{ID: team, Kind: policy.Team, Parent: org})
	require.ErrorIs(t, err, policy.ErrExists)
	_, err = b.store.CreateAccount(b.ctx, policy.Account{ID: org, Kind: policy.Org, Plan: "pro"})
	require.ErrorIs(t, err, policy.ErrExists)
	a, err := b.store.GetAccount(b.ctx, org)
	require.NoError(t, err)
	require.Equal(t, "free", a.Plan, "the first account stays")
}

func TestUpdateAccount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	org, team, other := b.id("org"), b.id("team"), b.id("other")
	b.create(t, policy.Account{ID: org, Kind: policy.Org, Plan: "free"})
	b.create(t, policy.Account{ID: other, Kind: policy.Org})
	created := b.create(t, policy.Account{ID: team, Kind: policy.Team, Parent: org, Concurrency: ptr(3),
		Limits: map[policy.Unit]policy.Limit{policy.Tokens: perHour(1000)}})

	up, err := b.store.UpdateAccount(b.ctx, policy.Account{ID: team, Plan: "pro", Limits: map[policy.Unit]policy.Limit{policy.Credits: {Quota: ptr[int64](10)}}})
	require.NoError(t, err)
	require.Equal(t, policy.Team, up.Kind)
	require.Equal(t, org, up.Parent)
	require.Equal(t, org, up.Org)
	require.Equal(t, "pro", up.Plan)
	require.Nil(t, up.Concurrency, "concurrency is replaced too")
	require.Equal(t, map[policy.Unit]policy.Limit{policy.Credits: {Algorithm: policy.TokenBucket, Quota: ptr[int64](10), QuotaPeriod: policy.Month}}, up.Limits, "limits are replaced, not merged")
	require.Equal(t, created.CreatedAt, up.CreatedAt)
	require.False(t, up.UpdatedAt.Before(created.UpdatedAt))
	got, err := b.store.GetAccount(b.ctx, team)
	require.NoError(t, err)
	require.Equal(t, up, got)

	// Giving kind and parent unchanged is fine; clearing the limits removes them.
	up, err = b.store.UpdateAccount(b.ctx, policy.Account{ID: team, Kind: policy.Team, Parent: org, Org: org})
	require.NoError(t, err)
	require.Empty(t, up.Limits)
	require.Empty(t, up.Plan)

	for _, tt := range []struct {
		name    string
		account policy.Account
		field   string
	}{
		{"kind changes", policy.Account{ID: team, Kind: policy.User}, "kind"},
		{"unknown kind", policy.Account{ID: team, Kind: "division"}, "kind"},
		{"parent changes", policy.Account{ID: team, Parent: other}, "parent"},
		{"org changes", policy.Account{ID: team, Org: other}, "org"},
		{"unknown plan", policy.Account{ID: team, Plan: "platinum"}, "plan"},
		{"bad limit", policy.Account{ID: team, Limits: map[policy.Unit]policy.Limit{policy.Tokens: {Burst: 3}}}, "limits"},
		{"negative concurrency", policy.Account{ID: team, Concurrency: ptr(-5)}, "concurrency"},
		{"ceiling below the burst", policy.Account{ID: team, Limits: map[policy.Unit]policy.Limit{policy.Tokens: {RatePerS: 1, Burst: 10, Ceiling: 9}}}, "limits"},
		{"ceiling on an org (kind left out)", policy.Account{ID: org, Limits: map[policy.Unit]policy.Limit{policy.Tokens: {RatePerS: 1, Burst: 10, Ceiling: 20}}}, "limits"},
		{"priority above 100", policy.Account{ID: team, Priority: ptr(101)}, "priority"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.store.UpdateAccount(b.ctx, tt.account)
			var inv *policy.InvalidError
			require.ErrorAs(t, err, &inv)
			require.Equal(t, tt.field, inv.Field, inv.Error())
		})
	}

	_, err = b.store.UpdateAccount(b.ctx, policy.Account{ID: b.id("ghost"), Plan: "pro"})
	require.ErrorIs(t, err, policy.ErrNotFound)
	_, err = b.store.UpdateAccount(b.ctx, policy.Account{ID: "not an id"})
	require.ErrorIs(t, err, policy.ErrNotFound)
}

// A ceiling and a priority go through the store and the cache as written; an update
// replaces them like the rest.
func TestCeilingAndPriority(t *testing.T) {
	t.Parallel()
	b := setup(t)
	org, team, user := b.id("org"), b.id("team"), b.id("user")
	guarantee := policy.Limit{Limit: 1000, WindowS: 60, Ceiling: 3000}
	b.create(t, policy.Account{ID: org, Kind: policy.Org, Plan: "pro", Priority: ptr(0),
		Limits: map[policy.Unit]policy.Limit{policy.Tokens: perHour(1_000_000)}})
	created := b.create(t, policy.Account{ID: team, Kind: policy.Team, Parent: org, Priority: ptr(80),
		Limits: map[policy.Unit]policy.Limit{policy.Tokens: guarantee}})
	b.create(t, policy.Account{ID: user, Kind: policy.User, Parent: team})
	require.Equal(t, ptr(80), created.Priority)
	require.Equal(t, guarantee.Normalize(), created.Limits[policy.Tokens])

	want := policy.Limit{Algorithm: policy.TokenBucket, RatePerS: 1000.0 / 60, Burst: 1000, Limit: 1000, WindowS: 60, Ceiling: 3000}
	got, err := b.store.GetAccount(b.ctx, team)
	require.NoError(t, err)
	require.Equal(t, created, got)
	require.Equal(t, want, got.Limits[policy.Tokens])
	require.True(t, got.Limits[policy.Tokens].Guaranteed())
	got, err = b.store.GetAccount(b.ctx, org)
	require.NoError(t, err)
	require.Equal(t, ptr(0), got.Priority, "0 is a priority, not none")
	got, err = b.store.GetAccount(b.ctx, user)
	require.NoError(t, err)
	require.Nil(t, got.Priority)

	b.reload(t)
	r := b.resolve(t, user)
	require.Equal(t, want, r.Path[1].Limits[policy.Tokens])
	require.Equal(t, 80, r.Priority, "the team's priority, inherited")
	require.Equal(t, 0, b.resolve(t, org).Priority)

	// An update replaces the priority and the ceiling: left out, they are gone.
	up, err := b.store.UpdateAccount(b.ctx, policy.Account{ID: team, Limits: map[policy.Unit]policy.Limit{policy.Tokens: perHour(1000)}})
	require.NoError(t, err)
	require.Nil(t, up.Priority)
	require.Zero(t, up.Limits[policy.Tokens].Ceiling)
	got, err = b.store.GetAccount(b.ctx, team)
	require.NoError(t, err)
	require.Equal(t, up, got)
	up, err = b.store.UpdateAccount(b.ctx, policy.Account{ID: user, Priority: ptr(100), Limits: map[policy.Unit]policy.Limit{policy.Requests: {RatePerS: 1, Burst: 5, Ceiling: 5}}})
	require.NoError(t, err)
	require.Equal(t, ptr(100), up.Priority)
	b.reload(t)
	r = b.resolve(t, user)
	require.Equal(t, 100, r.Priority)
	require.Equal(t, int64(5), r.Path[2].Limits[policy.Requests].Ceiling, "a ceiling equal to the burst")
}

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	org, user := b.id("org"), b.id("user")
	b.create(t, policy.Account{ID: org, Kind: policy.Org, Plan: "pro"})
	b.create(t, policy.Account{ID: user, Kind: policy.User, Parent: org})
	b.run(t)

	key, secret, err := b.store.CreateAPIKey(b.ctx, user)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(secret, policy.SecretPrefix), secret)
	require.Len(t, secret, len(policy.SecretPrefix)+43, "32 random bytes, base64url")
	require.True(t, policy.ValidID(key.ID), key.ID)
	require.Equal(t, user, key.Account)
	require.Nil(t, key.RevokedAt)
	require.False(t, key.CreatedAt.IsZero())
	_, secret2, err := b.store.CreateAPIKey(b.ctx, user)
	require.NoError(t, err)
	require.NotEqual(t, secret, secret2)

	// The database holds the hash only, in no encoding of the secret.
	var row string
	var hash []byte
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT k::text, hash FROM api_keys k WHERE id = $1`, key.ID).Scan(&row, &hash))
	require.Equal(t, policy.HashKey(secret), hash)
	for _, part := range []string{secret, strings.TrimPrefix(secret, policy.SecretPrefix)} {
		require.NotContains(t, row, part)
	}

	eventually(t, time.Second, "the cache learns of the new key", func() bool {
		_, _, err := b.cache.Authenticate(secret)
		return err == nil
	})
	got, r, err := b.cache.Authenticate(secret)
	require.NoError(t, err)
	require.Equal(t, key.ID, got.ID)
	require.Equal(t, user, r.Account())
	require.Equal(t, "pro", r.Plan)

	_, _, err = b.cache.Authenticate(policy.SecretPrefix + strings.Repeat("A", 43))
	require.ErrorIs(t, err, policy.ErrNotFound)
	_, _, err = b.cache.Authenticate("")
	require.ErrorIs(t, err, policy.ErrNotFound)
	_, _, err = b.store.CreateAPIKey(b.ctx, b.id("ghost"))
	require.ErrorIs(t, err, policy.ErrNotFound)
	_, _, err = b.store.CreateAPIKey(b.ctx, "not an id")
	require.ErrorIs(t, err, policy.ErrNotFound)

	require.NoError(t, b.store.RevokeAPIKey(b.ctx, key.ID))
	eventually(t, time.Second, "the cache learns of the revocation", func() bool {
		_, _, err := b.cache.Authenticate(secret)
		return errors.Is(err, policy.ErrRevoked)
	})
	got, _, _ = b.cache.Authenticate(secret)
	require.Equal(t, key.ID, got.ID, "a revoked key is still named")
	require.NotNil(t, got.RevokedAt)
	_, _, err = b.cache.Authenticate(secret2)
	require.NoError(t, err, "the other key still works")

	// Revoking again keeps the first time.
	require.NoError(t, b.store.RevokeAPIKey(b.ctx, key.ID))
	var revokedAt time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT revoked_at FROM api_keys WHERE id = $1`, key.ID).Scan(&revokedAt))
	require.True(t, revokedAt.Equal(*got.RevokedAt))
	require.ErrorIs(t, b.store.RevokeAPIKey(b.ctx, "key_ghost"), policy.ErrNotFound)
	for _, id := range []string{"key\x00nul", "key_\xff\xfe", ""} { // PostgreSQL would refuse these
		require.ErrorIs(t, b.store.RevokeAPIKey(b.ctx, id), policy.ErrNotFound, "%q", id)
	}
}
