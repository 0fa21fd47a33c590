package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/reconcile"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// The tree of every test: acme (pro, requests and tokens quotas, rates high enough for a
// burst of a thousand) → eng (requests and tokens quotas) → alice (a rate limit only) and
// bob (daily requests and tokens quotas). Monthly counters exist at acme and eng.
const (
	org  = "acme"
	team = "eng"
	user = "alice"
	bob  = "bob"

	bobRequestsPerDay = 30
)

type testBundle struct {
	pool   *pgxpool.Pool
	rdb    redis.UniversalClient
	keys   keyspace.Keys
	cache  *policy.Cache
	now    time.Time
	cur    time.Time // first instant of now's month
	prefix string
	offset int64
}

func quota(n int64) policy.Limit { return policy.Limit{Quota: &n, QuotaPeriod: policy.Month} }

func setup(t *testing.T, teamRequests int64) *testBundle {
	t.Helper()
	return setupOn(t, teamRequests, testenv.Redis(t))
}

func setupOn(t *testing.T, teamRequests int64, rdb redis.UniversalClient) *testBundle {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	pool, _ := testenv.EmptySchema(t)
	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	b := &testBundle{pool: pool, rdb: rdb, prefix: testenv.Prefix(t)}
	b.keys = keyspace.Keys{Prefix: b.prefix + "mg", Shards: 16}
	b.now = time.Now().UTC()
	b.cur = time.Date(b.now.Year(), b.now.Month(), 1, 0, 0, 0, 0, time.UTC)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b.flush(ctx, t)
	})

	store := policy.NewStore(pool)
	for _, a := range []policy.Account{
		{ID: org, Kind: policy.Org, Plan: "pro", Limits: map[policy.Unit]policy.Limit{
			policy.Requests: {RatePerS: 100_000, Burst: 100_000, Quota: quota(5_000_000).Quota, QuotaPeriod: policy.Month},
			policy.Tokens:   quota(10_000_000)}},
		{ID: team, Kind: policy.Team, Parent: org, Limits: map[policy.Unit]policy.Limit{policy.Requests: quota(teamRequests), policy.Tokens: quota(1_000_000)}},
		{ID: user, Kind: policy.User, Parent: team, Limits: map[policy.Unit]policy.Limit{policy.Requests: {RatePerS: 100_000, Burst: 100_000}}},
		{ID: bob, Kind: policy.User, Parent: team, Limits: map[policy.Unit]policy.Limit{
			policy.Requests: {Quota: quota(bobRequestsPerDay).Quota, QuotaPeriod: policy.Day},
			policy.Tokens:   {Quota: quota(100_000).Quota, QuotaPeriod: policy.Day}}},
	} {
		_, err := store.CreateAccount(ctx, a)
		require.NoError(t, err)
	}
	b.cache = policy.NewCache(pool, nil, time.Minute)
	require.NoError(t, b.cache.Reload(ctx))
	return b
}

// flush deletes the test's Redis keys, as a FLUSHALL would (on every master of a cluster).
func (b *testBundle) flush(ctx context.Context, t *testing.T) {
	del := func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, b.prefix+"*").Result()
		if err != nil || len(keys) == 0 {
			return err
		}
		pipe := c.Pipeline() // one key per DEL: a cluster node refuses keys of several slots
		for _, k := range keys {
			pipe.Del(ctx, k)
		}
		_, err = pipe.Exec(ctx)
		return err
	}
	if cc, ok := b.rdb.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachMaster(ctx, del))
		return
	}
	require.NoError(t, del(ctx, b.rdb.(*redis.Client)))
}

func (b *testBundle) opts() reconcile.Options {
	return reconcile.Options{Pool: b.pool, Redis: b.rdb, Keys: b.keys, Policies: b.cache, Clock: period.Fixed(b.now)}
}

func (b *testBundle) counter(t *testing.T, account string, u policy.Unit, month time.Time) int64 {
	t.Helper()
	v, err := b.rdb.Get(context.Background(), b.keys.Quota(org, account, u, period.MonthLabel(month))).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(t, err)
	return v
}

// event records an admitted request of alice as the meter would, and charges the quota
// counters of charged's month as admission would.
func (b *testBundle) event(t *testing.T, id string, at, charged time.Time, requests, tokens int64) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	billing := time.Date(at.Year(), at.Month(), 1, 0, 0, 0, 0, time.UTC)
	chargedMonth := time.Date(charged.Year(), charged.Month(), 1, 0, 0, 0, 0, time.UTC)
	_, err := b.pool.Exec(ctx, `select usage_events_partition($1)`, billing)
	require.NoError(t, err)
	b.offset++
	_, err = b.pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, requests, tokens, kafka_partition, kafka_offset)
values ($1, $2, $3, $4, $5, $6, 'user', $7, 'test', $8, $9, 0, $10)`,
		id, billing, at, chargedMonth, org, user, []string{org, team, user}, requests, tokens, b.offset)
	require.NoError(t, err)
	label := period.MonthLabel(charged)
	for _, acc := range []string{org, team} {
		require.NoError(t, b.rdb.IncrBy(ctx, b.keys.Quota(org, acc, policy.Tokens, label), tokens).Err())
	}
	require.NoError(t, b.rdb.IncrBy(ctx, b.keys.Quota(org, org, policy.Requests, label), requests).Err())
	require.NoError(t, b.rdb.IncrBy(ctx, b.keys.Quota(org, team, policy.Requests, label), requests).Err())
}

// dayCounter is bob's daily counter of unit on day's day.
func (b *testBundle) dayCounter(t *testing.T, u policy.Unit, day time.Time) int64 {
	t.Helper()
	v, err := b.rdb.Get(context.Background(), b.keys.Quota(org, bob, u, period.DayLabel(day))).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(t, err)
	return v
}

// bobEvent records an admitted request of bob as the meter would, and charges the counters
// admission would: acme's and eng's of at's month, bob's of at's day.
func (b *testBundle) bobEvent(t *testing.T, id string, at time.Time, requests, tokens int64) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	at = at.UTC()
	month := time.Date(at.Year(), at.Month(), 1, 0, 0, 0, 0, time.UTC)
	_, err := b.pool.Exec(ctx, `select usage_events_partition($1)`, month)
	require.NoError(t, err)
	b.offset++
	_, err = b.pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, requests, tokens, kafka_partition, kafka_offset)
values ($1, $2, $3, $2, $4, $5, 'user', $6, 'test', $7, $8, 0, $9)`,
		id, month, at, org, bob, []string{org, team, bob}, requests, tokens, b.offset)
	require.NoError(t, err)
	for _, acc := range []string{org, team} {
		require.NoError(t, b.rdb.IncrBy(ctx, b.keys.Quota(org, acc, policy.Requests, period.MonthLabel(at)), requests).Err())
		require.NoError(t, b.rdb.IncrBy(ctx, b.keys.Quota(org, acc, policy.Tokens, period.MonthLabel(at)), tokens).Err())
	}
	require.NoError(t, b.rdb.IncrBy(ctx, b.keys.Quota(org, bob, policy.Requests, period.DayLabel(at)), requests).Err())
	require.NoError(t, b.rdb.IncrBy(ctx, b.keys.Quota(org, bob, policy.Tokens, period.DayLabel(at)), tokens).Err())
}

func (b *testBundle) outcome(t *testing.T, id string, status int, tokens *int64) {
	t.Helper()
	b.offset++
	_, err := b.pool.Exec(testenv.Context(t, 30*time.Second), `insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
values ($1, $2, $3, now(), 'test', 0, $4)`, id, status, tokens, b.offset)
	require.NoError(t, err)
}

func ptr(n int64) *int64 { return &n }

func run(t *testing.T, o reconcile.Options) reconcile.Summary {
	t.Helper()
	s, err := reconcile.Run(testenv.Context(t, time.Minute), o)
	require.NoError(t, err)
	return s
}

func verify(t *testing.T, b *testBundle) []reconcile.Difference {
	t.Helper()
	d, problems, err := reconcile.Verify(testenv.Context(t, time.Minute), b.opts())
	require.NoError(t, err)
	require.Empty(t, problems)
	return d
}

// Ten requests of 100 tokens, three ending in 503: every quota level gives back exactly
// three requests and 300 tokens; a second run applies nothing. A dry run before changes
// nothing and plans what the run then applies; verify holds after, and names a counter
// pushed off and a counter no event explains.
func TestRefund5xx(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	at := b.cur.Add(time.Hour)
	for i := range 10 {
		id := fmt.Sprintf("ev-%d", i)
		b.event(t, id, at, at, 1, 100)
		status := 200
		if i < 3 {
			status = 503
		}
		b.outcome(t, id, status, nil)
	}

	o := b.opts()
	o.DryRun = true
	plan := run(t, o)
	require.Equal(t, 0, plan.AdjustmentsApplied)
	require.Equal(t, 3*2*2, plan.AdjustmentsPlanned, "3 events × 2 quota levels × 2 units")
	require.Equal(t, int64(10), b.counter(t, team, policy.Requests, at), "a dry run changes nothing")
	var rows int
	require.NoError(t, b.pool.QueryRow(context.Background(), `select count(*) from adjustments`).Scan(&rows))
	require.Zero(t, rows)

	s := run(t, b.opts())
	require.Equal(t, 12, s.AdjustmentsApplied)
	require.Equal(t, map[reconcile.Kind]int{reconcile.Refund5xx: 12}, s.ByKind)
	require.Zero(t, s.DriftFound)
	for _, acc := range []string{org, team} {
		require.Equal(t, int64(7), b.counter(t, acc, policy.Requests, at), acc)
		require.Equal(t, int64(700), b.counter(t, acc, policy.Tokens, at), acc)
	}
	require.Empty(t, verify(t, b))

	again := run(t, b.opts())
	require.Zero(t, again.AdjustmentsApplied)
	require.Zero(t, again.AdjustmentsPlanned)
	require.Equal(t, int64(7), b.counter(t, team, policy.Requests, at))

	require.NoError(t, b.rdb.IncrBy(context.Background(), b.keys.Quota(org, team, policy.Requests, period.MonthLabel(at)), 5).Err())
	diffs := verify(t, b)
	require.Len(t, diffs, 1)
	require.Equal(t, reconcile.Difference{Org: org, Account: team, Level: policy.Team, Unit: policy.Requests, QuotaPeriod: policy.Month,
		Period: period.MonthLabel(at), Redis: 12, Billable: 7}, diffs[0])

	// A counter that no event in the log explains (its events never reached PostgreSQL).
	prev := period.MonthLabel(b.cur.AddDate(0, -1, 0))
	require.NoError(t, b.rdb.Set(context.Background(), b.keys.Quota(org, team, policy.Tokens, prev), 4, 0).Err())
	diffs = verify(t, b)
	require.Len(t, diffs, 2)
	require.Equal(t, reconcile.Difference{Org: org, Account: team, Level: policy.Team, Unit: policy.Tokens, QuotaPeriod: policy.Month,
		Period: prev, Redis: 4, Billable: 0}, diffs[1])
}

// Estimated 2,500 tokens, actual 1,800: the tokens counters move by −700 at every level.
func TestSettleTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	at := b.cur.Add(time.Hour)
	b.event(t, "ev-1", at, at, 1, 2500)
	b.outcome(t, "ev-1", 200, ptr(1800))

	s := run(t, b.opts())
	require.Equal(t, map[reconcile.Kind]int{reconcile.SettleTokens: 2}, s.ByKind)
	for _, acc := range []string{org, team} {
		require.Equal(t, int64(1800), b.counter(t, acc, policy.Tokens, at), acc)
		require.Equal(t, int64(1), b.counter(t, acc, policy.Requests, at), acc)
	}
	var amounts []int64
	rows, err := b.pool.Query(context.Background(), `select amount from adjustments where kind = 'settle_tokens' and unit = 'tokens'`)
	require.NoError(t, err)
	for rows.Next() {
		var n int64
		require.NoError(t, rows.Scan(&n))
		amounts = append(amounts, n)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{-700, -700}, amounts)
	require.Empty(t, verify(t, b))
	require.Zero(t, run(t, b.opts()).AdjustmentsApplied)
}

// A request at the first millisecond of the month charged to the month before is moved:
// minus there, plus here, at every level; verify holds.
func TestPeriodMove(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	at := b.cur.Add(time.Millisecond)
	prev := b.cur.AddDate(0, -1, 0)
	b.event(t, "ev-1", b.cur.Add(-time.Hour), prev, 1, 10) // stays where it is
	b.event(t, "ev-2", at, prev, 1, 40)

	s := run(t, b.opts())
	require.Equal(t, map[reconcile.Kind]int{reconcile.PeriodMove: 8}, s.ByKind, "2 levels × 2 units × 2 periods")
	for _, acc := range []string{org, team} {
		require.Equal(t, int64(1), b.counter(t, acc, policy.Requests, prev), acc)
		require.Equal(t, int64(10), b.counter(t, acc, policy.Tokens, prev), acc)
		require.Equal(t, int64(1), b.counter(t, acc, policy.Requests, at), acc)
		require.Equal(t, int64(40), b.counter(t, acc, policy.Tokens, at), acc)
	}
	require.Empty(t, verify(t, b))
	require.Zero(t, run(t, b.opts()).AdjustmentsApplied)
}

// A thousand admissions through the admission script use up eng's quota of 1,000
// requests; Redis loses every key (as after a FLUSHALL); reconcile restores the counters
// from PostgreSQL, so the next request is still refused.
func TestDriftRestore(t *testing.T) {
	t.Parallel()
	const n = 1000
	b := setup(t, n)
	ctx := testenv.Context(t, 2*time.Minute)
	adm := admission.New(b.rdb, admission.Options{KeyPrefix: b.keys.Prefix, Shards: b.keys.Shards})
	pol, err := b.cache.Resolve(user)
	require.NoError(t, err)
	decisions := make([]admission.Decision, n)
	var g errgroup.Group
	g.SetLimit(16)
	for i := range decisions {
		g.Go(func() error {
			d, err := adm.Decide(ctx, admission.Request{EventID: adm.NewEventID(org), Policy: pol, Source: "test",
				Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 10}})
			decisions[i] = d
			return err
		})
	}
	require.NoError(t, g.Wait())
	var ids []string
	var times []time.Time
	for i, d := range decisions {
		require.Equal(t, admission.Allow, d.Result, "request %d", i)
		ids, times = append(ids, d.EventID), append(times, d.Time)
	}
	b.now = decisions[n-1].Time
	for _, m := range []time.Time{times[0], b.now} {
		_, err = b.pool.Exec(ctx, `select usage_events_partition($1)`, m)
		require.NoError(t, err)
	}
	// What the meter would have written, in one statement.
	_, err = b.pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, requests, tokens, kafka_partition, kafka_offset)
select id, date_trunc('month', at at time zone 'UTC')::date, at, date_trunc('month', at at time zone 'UTC')::date, $3, $4,
  'user', $5, 'test', 1, 10, 0, ord
from unnest($1::text[], $2::timestamptz[]) with ordinality as e(id, at, ord)`, ids, times, org, user, []string{org, team, user})
	require.NoError(t, err)
	require.Empty(t, verify(t, b), "counters match the log before the wipe")

	b.flush(ctx, t)
	require.Len(t, verify(t, b), 4, "acme and eng requests and tokens counters lost")

	s := run(t, b.opts())
	require.Equal(t, 4, s.DriftFound)
	require.Equal(t, map[reconcile.Kind]int{reconcile.DriftRestore: 4}, s.ByKind)
	for _, acc := range []string{org, team} {
		require.Equal(t, int64(n), b.counter(t, acc, policy.Requests, b.now), acc)
		require.Equal(t, int64(10*n), b.counter(t, acc, policy.Tokens, b.now), acc)
	}
	require.Greater(t, b.rdb.PTTL(ctx, b.keys.Quota(org, team, policy.Requests, period.MonthLabel(b.now))).Val(), time.Duration(0),
		"a restored counter expires like admission's")
	require.Empty(t, verify(t, b))

	d, err := adm.Decide(ctx, admission.Request{EventID: adm.NewEventID(org), Policy: pol, Source: "test",
		Units: map[policy.Unit]int64{policy.Requests: 1}})
	require.NoError(t, err)
	require.Equal(t, admission.QuotaExceeded, d.Result, "the quota still bites after the wipe")
	require.Equal(t, &admission.Blocker{Account: team, Level: policy.Team, Unit: string(policy.Requests)}, d.Blocked)
	require.Zero(t, run(t, b.opts()).AdjustmentsApplied)
}

// scenario gives a bundle every kind of correction: refunds, a settlement, a move, and a
// lost counter (drift).
func scenario(t *testing.T) *testBundle {
	b := setup(t, 1000)
	at := b.cur.Add(time.Hour)
	for i := range 6 {
		id := fmt.Sprintf("ev-%d", i)
		b.event(t, id, at, at, 1, 1000)
		switch i {
		case 0, 1:
			b.outcome(t, id, 502, nil)
		case 2:
			b.outcome(t, id, 200, ptr(400))
		}
	}
	b.event(t, "ev-move", b.cur.Add(time.Millisecond), b.cur.AddDate(0, -1, 0), 1, 50)
	// bob's requests of today: daily counters refunded and settled too.
	b.bobEvent(t, "ev-bob-0", b.now.Add(-time.Minute), 1, 100)
	b.outcome(t, "ev-bob-0", 500, nil)
	b.bobEvent(t, "ev-bob-1", b.now.Add(-time.Minute), 1, 100)
	b.outcome(t, "ev-bob-1", 200, ptr(70))
	// Redis lost eng's tokens counter.
	require.NoError(t, b.rdb.Del(context.Background(), b.keys.Quota(org, team, policy.Tokens, period.MonthLabel(at))).Err())
	return b
}

type state struct {
	Counters map[string]int64
	Rows     []string
}

func (b *testBundle) state(t *testing.T) state {
	t.Helper()
	st := state{Counters: map[string]int64{}}
	for _, p := range []time.Time{b.cur, b.cur.AddDate(0, -1, 0)} {
		for _, acc := range []string{org, team} {
			for _, u := range []policy.Unit{policy.Requests, policy.Tokens} {
				st.Counters[acc+":"+string(u)+":"+period.MonthLabel(p)] = b.counter(t, acc, u, p)
			}
		}
	}
	for _, d := range []time.Time{b.now, b.now.AddDate(0, 0, -1)} {
		for _, u := range []policy.Unit{policy.Requests, policy.Tokens} {
			st.Counters[bob+":"+string(u)+":"+period.DayLabel(d)] = b.dayCounter(t, u, d)
		}
	}
	rows, err := b.pool.Query(context.Background(), `select format('%s %s %s %s %s %s %s %s %s→%s %s', kind, account, level, unit, quota_period, period, amount,
  coalesce(source_event, '-'), redis_before, redis_after, applied_at is not null) from adjustments order by id`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		st.Rows = append(st.Rows, s)
	}
	require.NoError(t, rows.Err())
	sort.Strings(st.Rows)
	return st
}

var errCrash = errors.New("crash")

// A run that dies at a failpoint (after inserting corrections, after changing Redis and
// before marking, after marking), followed by a clean run, leaves the same counters and
// the same adjustment rows as one uninterrupted run; and verify holds.
func TestCrashSafety(t *testing.T) {
	t.Parallel()
	ref := scenario(t)
	s := run(t, ref.opts())
	require.Positive(t, s.ByKind[reconcile.Refund5xx])
	require.Positive(t, s.ByKind[reconcile.SettleTokens])
	require.Positive(t, s.ByKind[reconcile.PeriodMove])
	require.Positive(t, s.ByKind[reconcile.DriftRestore])
	require.Equal(t, int64(1), ref.dayCounter(t, policy.Requests, ref.now), "bob's daily requests: one of two refunded")
	require.Equal(t, int64(70), ref.dayCounter(t, policy.Tokens, ref.now), "bob's daily tokens: 100 refunded, 100 settled to 70")
	want := ref.state(t)
	require.Empty(t, verify(t, ref))

	for _, tc := range []struct {
		point string
		hit   int
	}{
		{reconcile.AfterInsert, 1}, // event corrections recorded, none applied
		{reconcile.AfterInsert, 2}, // drift recorded, not applied
		{reconcile.AfterRedis, 1},
		{reconcile.AfterRedis, 7},
		{reconcile.AfterRedis, 9},                    // the first refund (after ev-move's eight moves)
		{reconcile.AfterRedis, s.AdjustmentsApplied}, // the last one: a drift restore
		{reconcile.AfterMark, 4},
	} {
		t.Run(fmt.Sprintf("%s#%d", tc.point, tc.hit), func(t *testing.T) {
			t.Parallel()
			b := scenario(t)
			o := b.opts()
			hits := 0
			o.Failpoint = func(point string) error {
				if point == tc.point {
					hits++
					if hits == tc.hit {
						return errCrash
					}
				}
				return nil
			}
			_, err := reconcile.Run(testenv.Context(t, time.Minute), o)
			require.ErrorIs(t, err, errCrash)

			// A dry run now plans exactly what the next run applies.
			dry := b.opts()
			dry.DryRun = true
			plan := run(t, dry)
			applied := run(t, b.opts())
			require.Equal(t, plan.ByKind, applied.ByKind)
			require.Equal(t, want, b.state(t))
			require.Empty(t, verify(t, b))
			require.Zero(t, run(t, b.opts()).AdjustmentsApplied)
		})
	}
}

// Two runs at once, each on a pool of its own (as two reconcile processes), on a state that
// needs work: Redis lost the monthly counters of ten requests (acme and eng, requests and
// tokens). Each run's failpoint after it records its corrections waits until the other run
// has returned or reached the same point, so the two overlap for certain and neither is
// given the lock by hand. One run takes the run lock and restores the four counters; the
// other is refused with ErrRunning before it measures or records anything. Each counter is
// restored once: four drift_restore rows, all of the winning run, each applied once, and the
// counters equal the log's totals. (Without the lock both runs measure the same drift and
// each restores it.)
func TestOneRunAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	ctx := testenv.Context(t, time.Minute)
	at := b.cur.Add(time.Hour)
	for i := range 10 {
		b.event(t, fmt.Sprintf("ev-%d", i), at, at, 1, 100)
	}
	b.flush(ctx, t)
	require.Len(t, verify(t, b), 4, "acme and eng requests and tokens counters lost")

	type runResult struct {
		s   reconcile.Summary
		err error
	}
	var (
		results  [2]runResult
		arrived  = [2]chan struct{}{make(chan struct{}), make(chan struct{})}
		returned = [2]chan struct{}{make(chan struct{}), make(chan struct{})}
		start    = make(chan struct{})
		wg       sync.WaitGroup
	)
	for i := range 2 {
		pool, err := pgxpool.NewWithConfig(ctx, b.pool.Config().Copy())
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		o := b.opts()
		o.Pool = pool
		var once sync.Once
		o.Failpoint = func(point string) error {
			if point != reconcile.AfterInsert {
				return nil
			}
			once.Do(func() { close(arrived[i]) })
			select {
			case <-arrived[1-i]:
			case <-returned[1-i]:
			case <-time.After(30 * time.Second):
				return errors.New("the other run neither returned nor recorded its corrections within 30 s")
			}
			return nil
		}
		wg.Go(func() {
			defer close(returned[i])
			<-start
			results[i].s, results[i].err = reconcile.Run(ctx, o)
		})
	}
	close(start)
	wg.Wait()

	var winner, refused []int
	for i, r := range results {
		switch {
		case r.err == nil:
			winner = append(winner, i)
		case errors.Is(r.err, reconcile.ErrRunning):
			refused = append(refused, i)
		default:
			t.Errorf("run %d: %v", i, r.err)
		}
	}
	for i, r := range results {
		t.Logf("run %d: err %v, drift found %d, applied %d", i, r.err, r.s.DriftFound, r.s.AdjustmentsApplied)
	}
	// Every check below is made, so that a broken lock shows all it breaks.
	assert.Len(t, winner, 1, "exactly one run does the work")
	assert.Len(t, refused, 1, "the other is refused: ErrRunning")
	if len(winner) == 1 {
		s := results[winner[0]].s
		assert.Equal(t, 4, s.DriftFound)
		assert.Equal(t, 4, s.AdjustmentsApplied)
		assert.Equal(t, map[reconcile.Kind]int{reconcile.DriftRestore: 4}, s.ByKind)
		assert.Empty(t, s.InvariantFailures)
	}
	for _, i := range refused {
		assert.Zero(t, results[i].s.AdjustmentsApplied, "the refused run applied nothing")
	}

	var rows, runIDs, unapplied, mismatched, runs int
	var runID string
	require.NoError(t, b.pool.QueryRow(ctx, `select count(*), count(distinct run_id), coalesce(min(run_id::text), ''),
  count(*) filter (where applied_at is null), count(*) filter (where redis_after - redis_before <> amount) from adjustments`).
		Scan(&rows, &runIDs, &runID, &unapplied, &mismatched))
	require.NoError(t, b.pool.QueryRow(ctx, `select count(*) from reconcile_runs`).Scan(&runs))
	assert.Equal(t, 4, rows, "one drift_restore row per lost counter, not one per run")
	assert.Equal(t, 1, runIDs, "every row is of one run")
	if len(winner) == 1 {
		assert.Equal(t, results[winner[0]].s.RunID, runID, "of the run that took the lock")
	}
	assert.Zero(t, unapplied)
	assert.Zero(t, mismatched, "rows whose redis_after - redis_before is not their amount")
	assert.Equal(t, 1, runs, "the refused run recorded no run")
	for _, acc := range []string{org, team} {
		assert.Equal(t, int64(10), b.counter(t, acc, policy.Requests, at), "%s requests restored once", acc)
		assert.Equal(t, int64(1000), b.counter(t, acc, policy.Tokens, at), "%s tokens restored once", acc)
	}
	assert.Empty(t, verify(t, b))
	require.False(t, t.Failed())
	require.Zero(t, run(t, b.opts()).AdjustmentsApplied, "a run after them applies nothing")
}

// Outcomes and boundary events metered while a run is under way (after it computed its
// event corrections, before it measures drift) are left to the next run: they are not
// restored as drift first and then settled, moved or refunded again.
func TestLateOutcomeNotCountedTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	at := b.cur.Add(time.Hour)
	b.event(t, "ev-503", at, at, 1, 100)
	b.outcome(t, "ev-503", 503, nil)
	b.event(t, "ev-late", at, at, 1, 100)

	o := b.opts()
	done := false
	o.Failpoint = func(point string) error {
		if point == reconcile.AfterInsert && !done {
			done = true
			// The meter writes these while the run applies its first corrections.
			if _, err := b.pool.Exec(context.Background(), `insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
values ('ev-late', 200, 150, now(), 'test', 9, 1) on conflict do nothing`); err != nil {
				return err
			}
			b.event(t, "ev-move", b.cur.Add(time.Millisecond), b.cur.AddDate(0, -1, 0), 1, 10)
		}
		return nil
	}
	s := run(t, o)
	require.Zero(t, s.DriftFound)
	s = run(t, b.opts())
	require.Zero(t, s.DriftFound)
	require.Equal(t, map[reconcile.Kind]int{reconcile.SettleTokens: 2, reconcile.PeriodMove: 8}, s.ByKind)
	for _, acc := range []string{org, team} {
		require.Equal(t, int64(160), b.counter(t, acc, policy.Tokens, at), acc)
		require.Equal(t, int64(2), b.counter(t, acc, policy.Requests, at), acc)
	}
	require.Empty(t, verify(t, b))
	require.Zero(t, run(t, b.opts()).AdjustmentsApplied)
}

// Daily quotas through real admission, on Redis and on the 3-master Redis Cluster: bob
// spends his 30 requests of the day (the 31st is 402 at his level); five end in 503 and
// three report fewer tokens. Reconcile refunds and settles bob's daily counters as well as
// the monthly ones of eng and acme, so bob gets exactly five requests back; after Redis
// loses every key, drift_restore rebuilds the daily counters and the daily quota still
// bites. verify holds throughout and a second run applies nothing.
func TestDailyQuotas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"redis", func(t *testing.T) redis.UniversalClient { return testenv.Redis(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return testenv.RedisCluster(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Bob's 36 requests must fall on one UTC day.
			if next := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour); time.Until(next) < time.Minute {
				time.Sleep(time.Until(next) + time.Second)
			}
			b := setupOn(t, 1000, tc.rdb(t))
			ctx := testenv.Context(t, 2*time.Minute)
			adm := admission.New(b.rdb, admission.Options{KeyPrefix: b.keys.Prefix, Shards: b.keys.Shards})
			pol, err := b.cache.Resolve(bob)
			require.NoError(t, err)
			decide := func() admission.Decision {
				d, err := adm.Decide(ctx, admission.Request{EventID: adm.NewEventID(org), Policy: pol, Source: "test",
					Units: map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 100}})
				require.NoError(t, err)
				return d
			}
			var ids []string
			var times []time.Time
			admit := func(n int) {
				for range n {
					d := decide()
					require.Equal(t, admission.Allow, d.Result)
					ids, times = append(ids, d.EventID), append(times, d.Time)
				}
				d := decide()
				require.Equal(t, admission.QuotaExceeded, d.Result)
				require.Equal(t, &admission.Blocker{Account: bob, Level: policy.User, Unit: string(policy.Requests)}, d.Blocked)
			}
			// log records the admitted events as the meter would.
			logged := 0
			log := func() {
				_, err := b.pool.Exec(ctx, `select usage_events_partition($1)`, times[0])
				require.NoError(t, err)
				_, err = b.pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, requests, tokens, kafka_partition, kafka_offset)
select id, date_trunc('month', at at time zone 'UTC')::date, at, date_trunc('month', at at time zone 'UTC')::date, $3, $4,
  'user', $5, 'test', 1, 100, 0, $6 + ord
from unnest($1::text[], $2::timestamptz[]) with ordinality as e(id, at, ord)`, ids[logged:], times[logged:], org, bob, []string{org, team, bob}, logged)
				require.NoError(t, err)
				logged = len(ids)
				b.offset = int64(logged)
			}

			admit(bobRequestsPerDay)
			log()
			b.now = times[len(times)-1]
			require.Empty(t, verify(t, b), "admission's counters match the log")
			for _, id := range ids[:5] {
				b.outcome(t, id, 503, nil)
			}
			for _, id := range ids[5:8] {
				b.outcome(t, id, 200, ptr(40))
			}

			s := run(t, b.opts())
			// Per 503: requests and tokens at acme, eng (month) and bob (day); per settlement: tokens at the three.
			require.Equal(t, map[reconcile.Kind]int{reconcile.Refund5xx: 5 * 6, reconcile.SettleTokens: 3 * 3}, s.ByKind)
			require.Equal(t, int64(bobRequestsPerDay-5), b.dayCounter(t, policy.Requests, b.now))
			require.Equal(t, int64(bobRequestsPerDay*100-5*100-3*60), b.dayCounter(t, policy.Tokens, b.now))
			require.Equal(t, int64(bobRequestsPerDay-5), b.counter(t, team, policy.Requests, b.now))
			var dayRows int
			require.NoError(t, b.pool.QueryRow(ctx, `select count(*) from adjustments
where quota_period = 'day' and account = $1 and period = $2::date and applied_at is not null`, bob, period.DayLabel(b.now)).Scan(&dayRows))
			require.Equal(t, 5*2+3, dayRows)
			require.Empty(t, verify(t, b))
			require.Zero(t, run(t, b.opts()).AdjustmentsApplied)

			admit(5) // exactly the five refunded requests, then 402 again
			log()
			b.now = times[len(times)-1]
			require.Empty(t, verify(t, b))

			b.flush(ctx, t)
			diffs := verify(t, b)
			require.Len(t, diffs, 6, "acme's and eng's monthly, bob's daily requests and tokens counters lost: %v", diffs)
			s = run(t, b.opts())
			require.Equal(t, map[reconcile.Kind]int{reconcile.DriftRestore: 6}, s.ByKind)
			require.Equal(t, int64(bobRequestsPerDay), b.dayCounter(t, policy.Requests, b.now))
			require.Greater(t, b.rdb.PTTL(ctx, b.keys.Quota(org, bob, policy.Requests, period.DayLabel(b.now))).Val(), 24*time.Hour,
				"a restored daily counter expires like admission's: its day plus the retention")
			require.Empty(t, verify(t, b))
			d := decide()
			require.Equal(t, admission.QuotaExceeded, d.Result, "the daily quota still bites after the wipe")
			require.Zero(t, run(t, b.opts()).AdjustmentsApplied)
		})
	}
}

// The checks after a run: Redis losing a counter between the last correction and the
// checks leaves it below its billable total, and the run says so (ErrInvariant, the counter
// named); the next run restores it and passes.
func TestInvariantCheck(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	at := b.cur.Add(time.Hour)
	b.event(t, "ev-0", at, at, 1, 100)
	o := b.opts()
	o.Failpoint = func(point string) error {
		if point == reconcile.BeforeCheck {
			require.NoError(t, b.rdb.Del(context.Background(), b.keys.Quota(org, team, policy.Tokens, period.MonthLabel(at))).Err())
		}
		return nil
	}
	s, err := reconcile.Run(testenv.Context(t, time.Minute), o)
	require.ErrorIs(t, err, reconcile.ErrInvariant)
	require.Len(t, s.InvariantFailures, 1, "%v", s.InvariantFailures)
	require.Contains(t, s.InvariantFailures[0], "acme eng tokens "+period.MonthLabel(at)+": redis 0, billable 100")

	s = run(t, b.opts())
	require.Equal(t, map[reconcile.Kind]int{reconcile.DriftRestore: 1}, s.ByKind)
	require.Empty(t, s.InvariantFailures)
	require.Equal(t, int64(100), b.counter(t, team, policy.Tokens, at))
}
