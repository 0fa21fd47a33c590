package policy_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// Shape of the large tree: 1,000 orgs × 9 teams × 10 users = 100,000 accounts, an override
// on every team (a guarantee with a ceiling) and every user, a priority on every user, and
// 10,000 API keys.
const (
	bigOrgs          = 1000
	bigTeamsPerOrg   = 9
	bigUsersPerTeam  = 10
	bigAccounts      = bigOrgs * (1 + bigTeamsPerOrg*(1+bigUsersPerTeam))
	bigKeys          = 10_000
	bigSecretPattern = "secret-%d" // as the SQL above writes them
)

// seedBig fills a schema of its own (the package schema is shared with tests that reload
// often) with the large tree, in a few set-based statements.
func seedBig(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool := migratedSchema(tb)
	ctx := testenv.Context(tb, 5*time.Minute)
	_, err := pool.Exec(ctx, fmt.Sprintf(`
		INSERT INTO accounts (id, kind, org, plan)
			SELECT 'o' || o, 'org', 'o' || o, (ARRAY['free', 'pro', 'enterprise'])[1 + o %% 3]
			FROM generate_series(1, %[1]d) o;
		INSERT INTO accounts (id, kind, parent, org)
			SELECT 'o' || o || '.t' || t, 'team', 'o' || o, 'o' || o
			FROM generate_series(1, %[1]d) o, generate_series(1, %[2]d) t;
		INSERT INTO accounts (id, kind, parent, org, concurrency, priority)
			SELECT 'o' || o || '.t' || t || '.u' || u, 'user', 'o' || o || '.t' || t, 'o' || o, u %% 3, u %% 3 * 50
			FROM generate_series(1, %[1]d) o, generate_series(1, %[2]d) t, generate_series(1, %[3]d) u;
		INSERT INTO account_limits (account, unit, "limit", window_s, burst, rate_per_s, ceiling)
			SELECT id, 'tokens', 500000, 3600, 500000, 500000 / 3600.0, 1000000 FROM accounts WHERE kind = 'team';
		INSERT INTO account_limits (account, unit, quota, quota_period)
			SELECT id, 'requests', 1000, 'day' FROM accounts WHERE kind = 'user';
		INSERT INTO api_keys (id, account, hash)
			SELECT 'k' || k, 'o' || (1 + k %% %[1]d) || '.t1.u1', sha256(convert_to('secret-' || k, 'UTF8'))
			FROM generate_series(1, %[4]d) k;
		ANALYZE accounts;`,
		bigOrgs, bigTeamsPerOrg, bigUsersPerTeam, bigKeys))
	require.NoError(tb, err)
	return pool
}

// TestLoad100k measures a full load of 100,000 accounts and checks what it resolved. The
// number for the design: go test -run TestLoad100k -v ./internal/policy/ (without -race, which
// slows it several times).
func TestLoad100k(t *testing.T) {
	t.Parallel()
	pool := seedBig(t)
	ctx := testenv.Context(t, 5*time.Minute)
	c := policy.NewCache(pool, quietLog(), time.Minute)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	require.NoError(t, c.Reload(ctx))
	took := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("loaded %d accounts and %d API keys in %s; live heap +%.1f MiB", c.Len(), bigKeys, took.Round(time.Millisecond),
		float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20))
	require.Equal(t, bigAccounts, c.Len())
	require.Less(t, took, time.Minute, "a load that slow would hold back every policy change")

	r, err := c.Resolve("o2.t9.u10")
	require.NoError(t, err)
	require.Equal(t, "o2", r.Org)
	require.Equal(t, "enterprise", r.Plan) // 1 + 2 % 3 = 3
	require.Equal(t, []string{"o2", "o2.t9", "o2.t9.u10"}, accounts(r))
	require.Equal(t, int64(500_000), r.Path[1].Limits[policy.Tokens].Burst)
	require.Equal(t, int64(1_000_000), r.Path[1].Limits[policy.Tokens].Ceiling)
	require.Equal(t, 10%3*50, r.Priority)
	require.Equal(t, policy.Day, r.Path[2].Limits[policy.Requests].QuotaPeriod)
	require.Equal(t, 10%3, r.Path[2].Concurrency)

	key, r, err := c.Authenticate(fmt.Sprintf(bigSecretPattern, 7))
	require.NoError(t, err)
	require.Equal(t, "k7", key.ID)
	require.Equal(t, "o8.t1.u1", r.Account())
}

// BenchmarkCache measures the load of 100,000 accounts and the hot-path lookups on it:
// go test -run '^$' -bench BenchmarkCache ./internal/policy/
func BenchmarkCache(b *testing.B) {
	pool := seedBig(b)
	ctx := context.Background()
	c := policy.NewCache(pool, quietLog(), time.Minute)
	require.NoError(b, c.Reload(ctx))

	b.Run("reload_100k", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Reload(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("resolve", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Resolve("o500.t5.u5"); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("authenticate", func(b *testing.B) {
		b.ReportAllocs()
		secret := fmt.Sprintf(bigSecretPattern, 42)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, _, err := c.Authenticate(secret); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
