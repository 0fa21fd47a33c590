package reconcile_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

func creditGrant(n int) string { return fmt.Sprintf("gr_%032x", n) }

// grant records a grant of acme's tokens in PostgreSQL and mirrors it into Redis, as
// internal/credit does.
func (b *testBundle) grant(t *testing.T, id string, amount int64, priority int) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	effective := b.now.Add(-24 * time.Hour)
	_, err := b.pool.Exec(ctx, `insert into credit_grants (id, org, account, unit, amount, effective_at, priority, source)
		values ($1, $2, $2, 'tokens', $3, $4, $5, 'purchase')`, id, org, amount, effective, priority)
	require.NoError(t, err)
	require.NoError(t, b.rdb.HSet(ctx, b.keys.Grants(org, org, policy.Tokens), id, amount).Err())
	require.NoError(t, b.rdb.HSet(ctx, b.keys.GrantTerms(org, org, policy.Tokens), id,
		fmt.Sprintf("%d|%d|0", priority, effective.UnixMilli())).Err())
}

// drew records an admitted request of alice (its event, as event() does) that drew from
// acme's grants, and the draws in Redis and in credit_consumptions, as admission and the
// meter do.
func (b *testBundle) drew(t *testing.T, id string, tokens int64, draws map[string]int64) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	b.event(t, id, b.now, b.now, 1, tokens)
	for g, n := range draws {
		require.NoError(t, b.rdb.HIncrBy(ctx, b.keys.Grants(org, org, policy.Tokens), g, -n).Err())
		_, err := b.pool.Exec(ctx, `insert into credit_consumptions (event_id, grant_id, billing_period, charged_period, event_time, org, account, unit, units)
			values ($1, $2, $3, $3, $4, $5, $5, 'tokens', $6)`, id, g, b.cur, b.now, org, n)
		require.NoError(t, err)
	}
}

func (b *testBundle) remaining(t *testing.T) map[string]int64 {
	t.Helper()
	m, err := b.rdb.HGetAll(context.Background(), b.keys.Grants(org, org, policy.Tokens)).Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for k, v := range m {
		n, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
		out[k] = n
	}
	return out
}

// ledger is finance_credit_balances for acme's tokens.
func (b *testBundle) ledger(t *testing.T) (granted, consumed, refunded, voided, expired, balance int64) {
	t.Helper()
	err := b.pool.QueryRow(context.Background(), `select granted, consumed, refunded, voided, expired, balance
		from finance_credit_balances where account = $1 and unit = 'tokens'`, org).Scan(&granted, &consumed, &refunded, &voided, &expired, &balance)
	require.NoError(t, err)
	return
}

// A request that bills nothing gives back all it drew, one that bills fewer tokens than it
// drew the difference, to the grants it drew from, once; the books tie out with Redis.
func TestCreditRefundAndSettle(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	g1, g2 := creditGrant(1), creditGrant(2)
	b.grant(t, g1, 1000, 5)
	b.grant(t, g2, 500, 0)
	b.drew(t, "e-ok", 300, map[string]int64{g1: 300})             // 200, bills 300
	b.drew(t, "e-503", 400, map[string]int64{g1: 400})            // 503: bills nothing
	b.drew(t, "e-split", 500, map[string]int64{g1: 300, g2: 200}) // 200 with 350 actual: 150 back
	b.drew(t, "e-void", 100, map[string]int64{g2: 100})           // voided
	b.outcome(t, "e-ok", 200, nil)
	b.outcome(t, "e-503", 503, nil)
	b.outcome(t, "e-split", 200, ptr(350))
	_, err := b.pool.Exec(context.Background(), `insert into usage_voids (event_id, reason, attempt, void_time, source, kafka_partition, kafka_offset)
		values ('e-void', 'caller_gone', 'e-void', now(), 'test', 0, 999)`)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{g1: 0, g2: 200}, b.remaining(t))

	s := run(t, b.opts())
	require.Equal(t, 3, s.CreditsPlanned, "e-503, e-split (from g2, the highest id, first) and e-void")
	require.Equal(t, 3, s.CreditsApplied)
	// g1: 1000 - 300 - 400 - 300 + 400 = 400; g2: 500 - 200 - 100 + 150 + 100 = 450.
	require.Equal(t, map[string]int64{g1: 400, g2: 450}, b.remaining(t))
	granted, consumed, refunded, voided, expired, balance := b.ledger(t)
	require.Equal(t, []int64{1500, 1300, 650, 0, 0, 850}, []int64{granted, consumed, refunded, voided, expired, balance})
	require.Equal(t, int64(400+450), balance, "the ledger ties out with Redis")

	again := run(t, b.opts())
	require.Zero(t, again.CreditsPlanned, "a second run gives back nothing")
	require.Zero(t, again.CreditsRestored)
	require.Equal(t, map[string]int64{g1: 400, g2: 450}, b.remaining(t))
}

// A Redis wipe never creates credit: the restore puts each grant back at its ledger's
// remaining units, and lowers one found above it; a voided grant is not put back.
func TestCreditRestoreAfterWipe(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	g1, g2, g3 := creditGrant(1), creditGrant(2), creditGrant(3)
	b.grant(t, g1, 1000, 0)
	b.grant(t, g2, 500, 0)
	b.grant(t, g3, 700, 0)
	b.drew(t, "e-1", 600, map[string]int64{g1: 600})
	b.outcome(t, "e-1", 200, nil)
	_, err := b.pool.Exec(context.Background(), `update credit_grants set voided_at = now(), voided_units = 700 where id = $1`, g3)
	require.NoError(t, err)

	ctx := testenv.Context(t, 10*time.Second)
	b.flush(ctx, t)
	s := run(t, b.opts())
	require.Equal(t, 2, s.CreditsRestored)
	require.Equal(t, map[string]int64{g1: 400, g2: 500}, b.remaining(t), "the ledger's, the voided grant left out")
	terms, err := b.rdb.HGet(ctx, b.keys.GrantTerms(org, org, policy.Tokens), g1).Result()
	require.NoError(t, err)
	require.Regexp(t, `^0\|\d+\|0$`, terms)

	// Redis above the ledger (a lost draw) is lowered; below it (a draw not metered yet)
	// is left alone.
	require.NoError(t, b.rdb.HSet(ctx, b.keys.Grants(org, org, policy.Tokens), g1, 450, g2, 480).Err())
	s = run(t, b.opts())
	require.Equal(t, 1, s.CreditsRestored)
	require.Equal(t, map[string]int64{g1: 400, g2: 480}, b.remaining(t))
	var restores int
	require.NoError(t, b.pool.QueryRow(ctx, `select count(*) from credit_adjustments where kind = 'restore'`).Scan(&restores))
	require.Equal(t, 3, restores)
	_, _, _, _, _, balance := b.ledger(t)
	require.Equal(t, int64(900), balance, "the restore changes Redis, not the books")
}

// A plan's recurring grant is issued to every account naming the plan once per month,
// however many runs, usable from the month's start to its end.
func TestPlanGrantsOncePerMonth(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	ctx := testenv.Context(t, 30*time.Second)
	_, err := b.pool.Exec(ctx, `insert into plan_grants (plan, unit, amount, priority) values ('pro', 'cost_micros', 5000000, 10)`)
	require.NoError(t, err)
	for range 2 {
		run(t, b.opts())
	}
	var n int
	var amount int64
	var effective, expires time.Time
	var source string
	require.NoError(t, b.pool.QueryRow(ctx, `select count(*), max(amount), min(effective_at), max(expires_at), max(source)
		from credit_grants where account = $1 and unit = 'cost_micros'`, org).Scan(&n, &amount, &effective, &expires, &source))
	require.Equal(t, 1, n, "once, whatever the runs")
	require.Equal(t, int64(5000000), amount)
	require.Equal(t, "plan", source)
	require.True(t, effective.Equal(b.cur), "from the month's start: %s", effective)
	require.True(t, expires.Equal(b.cur.AddDate(0, 1, 0)), "to its end: %s", expires)
	got, err := b.rdb.HGetAll(ctx, b.keys.Grants(org, org, policy.CostMicros)).Result()
	require.NoError(t, err)
	require.Len(t, got, 1)
	for _, v := range got {
		require.Equal(t, "5000000", v, "mirrored into Redis")
	}

	// Next month, another.
	next := b.opts()
	next.Clock = period.Fixed(b.cur.AddDate(0, 1, 3))
	run(t, next)
	require.NoError(t, b.pool.QueryRow(ctx, `select count(*) from credit_grants where account = $1 and unit = 'cost_micros'`, org).Scan(&n))
	require.Equal(t, 2, n)
}

// A grant voided in Redis whose void PostgreSQL has not recorded yet (the void's second
// step failed) is not put back by the restore.
func TestCreditRestoreHonoursAVoidInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	g := creditGrant(1)
	b.grant(t, g, 1000, 0)
	ctx := testenv.Context(t, 10*time.Second)
	require.NoError(t, b.rdb.HDel(ctx, b.keys.Grants(org, org, policy.Tokens), g).Err())
	require.NoError(t, b.rdb.Set(ctx, b.keys.GrantVoided(org, org, policy.Tokens, g), 1000, time.Hour).Err())
	s := run(t, b.opts())
	require.Zero(t, s.CreditsRestored)
	require.Empty(t, b.remaining(t))
}
