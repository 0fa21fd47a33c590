package policy_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

var policyTables = []string{"plans", "plan_limits", "accounts", "account_limits", "api_keys"}

// The policy migration rolls back to nothing of its own and applies again with its seeds.
func TestPolicyMigrationDownUp(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.EmptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	count := func(q string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, q, schema).Scan(&n))
		return n
	}
	tables := func() int {
		return count(`SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name = ANY('{plans,plan_limits,accounts,account_limits,api_keys}')`)
	}
	functions := func() int {
		return count(`SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 AND p.proname = 'policy_notify'`)
	}

	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, len(policyTables), tables())
	require.Equal(t, 1, functions())

	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 1)
	require.NoError(t, err)
	require.Zero(t, tables())
	require.Zero(t, functions())
	require.Zero(t, count(`SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = $1 AND t.typname = ANY('{plans,plan_limits,accounts,account_limits,api_keys}')`))

	_, err = migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, len(policyTables), tables())
	plans, err := policy.NewStore(pool).Plans(ctx)
	require.NoError(t, err)
	require.Len(t, plans, 3)
	for _, pl := range plans {
		require.Equal(t, seedPlans[pl.ID], pl.Limits[policy.Requests], pl.ID)
	}
}

// migratedSchema is a schema of the test alone with every migration applied, for tests that
// change plans (which all tests of the package schema share) or load many rows.
func migratedSchema(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, _ := testenv.EmptySchema(tb)
	_, err := migrations.Up(testenv.Context(tb, time.Minute), pool)
	require.NoError(tb, err)
	return pool
}

// The smallest plan is the one of lowest rank, whatever the names; with no plan at all
// there is nothing safe to clamp to, and the load fails.
func TestSmallestPlanIsLowestRank(t *testing.T) {
	t.Parallel()
	pool := migratedSchema(t)
	ctx := testenv.Context(t, time.Minute)
	_, err := pool.Exec(ctx, `
		INSERT INTO plans (id, rank) VALUES ('aaa', 10), ('trial', -1);
		INSERT INTO plan_limits (plan, unit, rate_per_s, burst) VALUES ('trial', 'requests', 1, 1);
		INSERT INTO accounts (id, kind, org, plan) VALUES ('acme', 'org', 'acme', 'gone');`)
	require.NoError(t, err)
	c := policy.NewCache(pool, quietLog(), time.Minute)
	require.NoError(t, c.Reload(ctx))
	r, err := c.Resolve("acme")
	require.NoError(t, err)
	require.Equal(t, "trial", r.Plan)
	require.Equal(t, policy.Limit{Algorithm: policy.TokenBucket, RatePerS: 1, Burst: 1}, r.Path[0].Limits[policy.Requests])

	_, err = pool.Exec(ctx, `DELETE FROM plans`)
	require.NoError(t, err)
	fresh := policy.NewCache(pool, quietLog(), time.Minute)
	require.ErrorContains(t, fresh.Reload(ctx), "no plans")
	require.False(t, fresh.Loaded())
	require.ErrorContains(t, c.Reload(ctx), "no plans")
	r, err = c.Resolve("acme")
	require.NoError(t, err, "a failed load keeps the previous policies")
	require.Equal(t, "trial", r.Plan)
}

// A plan's priority and a plan limit's ceiling, set in SQL (there is no admin API for
// plans), reach Plans and the cache.
func TestPlanPriorityAndCeiling(t *testing.T) {
	t.Parallel()
	pool := migratedSchema(t)
	ctx := testenv.Context(t, time.Minute)
	_, err := pool.Exec(ctx, `
		UPDATE plans SET priority = 60 WHERE id = 'pro';
		INSERT INTO plans (id, rank, priority) VALUES ('team-gold', 10, 90);
		INSERT INTO plan_limits (plan, unit, rate_per_s, burst, ceiling) VALUES ('team-gold', 'tokens', 10, 100, 400);
		INSERT INTO accounts (id, kind, org, plan) VALUES ('acme', 'org', 'acme', 'pro');
		INSERT INTO accounts (id, kind, parent, org, plan) VALUES ('gold', 'team', 'acme', 'acme', 'team-gold');
		INSERT INTO accounts (id, kind, parent, org, priority) VALUES ('batch', 'team', 'acme', 'acme', 5);`)
	require.NoError(t, err)

	plans, err := policy.NewStore(pool).Plans(ctx)
	require.NoError(t, err)
	priorities := map[string]int{}
	for _, p := range plans {
		priorities[p.ID] = p.Priority
	}
	require.Equal(t, map[string]int{"free": 0, "pro": 60, "enterprise": 0, "team-gold": 90}, priorities)
	require.Equal(t, policy.Limit{Algorithm: policy.TokenBucket, RatePerS: 10, Burst: 100, Ceiling: 400}, plans[len(plans)-1].Limits[policy.Tokens])

	c := policy.NewCache(pool, quietLog(), time.Minute)
	require.NoError(t, c.Reload(ctx))
	r, err := c.Resolve("acme")
	require.NoError(t, err)
	require.Equal(t, 60, r.Priority, "the org's plan's")
	r, err = c.Resolve("gold")
	require.NoError(t, err)
	require.Equal(t, int64(400), r.Path[1].Limits[policy.Tokens].Ceiling)
	r, err = c.Resolve("batch")
	require.NoError(t, err)
	require.Equal(t, 5, r.Priority, "its own")
}

// The table constraints refuse what the store refuses, for rows written by hand.
func TestConstraints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	org, other := b.id("org"), b.id("other")
	b.create(t, policy.Account{ID: org, Kind: policy.Org})
	b.create(t, policy.Account{ID: other, Kind: policy.Org})
	x := b.id("x")
	for _, tt := range []struct {
		name string
		sql  string
		args []any
	}{
		{"bad id", `INSERT INTO accounts (id, kind, org) VALUES ('a:b', 'org', 'a:b')`, nil},
		{"unknown kind", `INSERT INTO accounts (id, kind, parent, org) VALUES ($1, 'division', $2, $2)`, []any{x, org}},
		{"org with a parent", `INSERT INTO accounts (id, kind, parent, org) VALUES ($1, 'org', $2, $1)`, []any{x, org}},
		{"org of another org", `INSERT INTO accounts (id, kind, org) VALUES ($1, 'org', $2)`, []any{x, org}},
		{"team without a parent", `INSERT INTO accounts (id, kind, org) VALUES ($1, 'team', $2)`, []any{x, org}},
		{"team of another org than its parent's", `INSERT INTO accounts (id, kind, parent, org) VALUES ($1, 'team', $2, $3)`, []any{x, org, other}},
		{"negative concurrency", `INSERT INTO accounts (id, kind, org, concurrency) VALUES ($1, 'org', $1, -1)`, []any{x}},
		{"unknown unit", `INSERT INTO account_limits (account, unit, quota, quota_period) VALUES ($1, 'gpus', 1, 'month')`, []any{org}},
		{"rate without burst", `INSERT INTO account_limits (account, unit, rate_per_s) VALUES ($1, 'tokens', 1)`, []any{org}},
		{"limit without window", `INSERT INTO account_limits (account, unit, "limit", burst, rate_per_s) VALUES ($1, 'tokens', 5, 5, 1)`, []any{org}},
		{"sliding window without window", `INSERT INTO account_limits (account, unit, algorithm, "limit") VALUES ($1, 'tokens', 'sliding_window', 5)`, []any{org}},
		{"sliding window with a burst", `INSERT INTO account_limits (account, unit, algorithm, "limit", window_s, burst, rate_per_s) VALUES ($1, 'tokens', 'sliding_window', 5, 60, 5, 1)`, []any{org}},
		{"unknown algorithm", `INSERT INTO account_limits (account, unit, algorithm, burst, rate_per_s) VALUES ($1, 'tokens', 'leaky', 5, 1)`, []any{org}},
		{"quota without period", `INSERT INTO account_limits (account, unit, quota) VALUES ($1, 'tokens', 5)`, []any{org}},
		{"quota below -1", `INSERT INTO account_limits (account, unit, quota, quota_period) VALUES ($1, 'tokens', -2, 'month')`, []any{org}},
		{"empty limit", `INSERT INTO account_limits (account, unit) VALUES ($1, 'tokens')`, []any{org}},
		{"hash not SHA-256", `INSERT INTO api_keys (id, account, hash) VALUES ($1, $2, '\x00')`, []any{x, org}},
		{"plan limit without plan", `INSERT INTO plan_limits (plan, unit, quota, quota_period) VALUES ($1, 'tokens', 1, 'month')`, []any{x}},
		{"ceiling below the burst", `INSERT INTO account_limits (account, unit, rate_per_s, burst, ceiling) VALUES ($1, 'tokens', 1, 10, 9)`, []any{org}},
		{"negative ceiling", `INSERT INTO account_limits (account, unit, rate_per_s, burst, ceiling) VALUES ($1, 'tokens', 1, 10, -1)`, []any{org}},
		{"ceiling on a sliding window", `INSERT INTO account_limits (account, unit, algorithm, "limit", window_s, ceiling) VALUES ($1, 'tokens', 'sliding_window', 5, 60, 10)`, []any{org}},
		{"ceiling on a quota alone", `INSERT INTO account_limits (account, unit, quota, quota_period, ceiling) VALUES ($1, 'tokens', 5, 'month', 10)`, []any{org}},
		{"plan ceiling below the burst", `INSERT INTO plan_limits (plan, unit, rate_per_s, burst, ceiling) VALUES ('free', 'tokens', 1, 10, 9)`, nil},
		{"plan ceiling on a sliding window", `INSERT INTO plan_limits (plan, unit, algorithm, "limit", window_s, ceiling) VALUES ('free', 'tokens', 'sliding_window', 5, 60, 10)`, nil},
		{"priority above 100", `UPDATE accounts SET priority = 101 WHERE id = $1`, []any{org}},
		{"negative priority", `UPDATE accounts SET priority = -1 WHERE id = $1`, []any{org}},
		{"plan priority above 100", `UPDATE plans SET priority = 101 WHERE id = 'free'`, nil},
		{"plan priority null", `UPDATE plans SET priority = NULL WHERE id = 'free'`, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Inside a transaction rolled back, so a constraint that let a row through
			// would not disturb the other tests.
			tx, err := b.pool.Begin(b.ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(b.ctx) }()
			_, err = tx.Exec(b.ctx, tt.sql, tt.args...)
			require.Error(t, err)
		})
	}
}
