package reconcile_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/reconcile"
	"github.com/metergate/metergate/internal/testenv"
)

// Beside acme, two orgs with bad data (issue 28, finding 3): "broke", a counting-only
// tokens quota whose counter Redis holds as "1.38e+19" (what admission used to leave after
// units past 2^53), with a request that ended in 503; and "huge", whose billing log sums
// past bigint (9,300 requests of 10^15 tokens). verify and a run report both, by org, key
// and raw value, and still check and correct acme; the run fails (ErrProblems) so cron
// notices. Once the counter is deleted the next run applies broke's pending refund and
// rebuilds its counter from the log.
func TestBadDataOfOneOrgDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	ctx := testenv.Context(t, 2*time.Minute)
	at := b.cur.Add(time.Hour)
	month := period.MonthLabel(at)

	uncapped := int64(-1)
	store := policy.NewStore(b.pool)
	for _, id := range []string{"broke", "huge"} {
		_, err := store.CreateAccount(ctx, policy.Account{ID: id, Kind: policy.Org, Plan: "pro",
			Limits: map[policy.Unit]policy.Limit{policy.Tokens: {Quota: &uncapped, QuotaPeriod: policy.Month}}})
		require.NoError(t, err)
	}
	require.NoError(t, b.cache.Reload(ctx))

	// acme: 3 requests, one a 503 (a refund at acme and eng); acme's tokens counter lost.
	for i, status := range []int{200, 200, 503} {
		id := "acme-" + string(rune('a'+i))
		b.event(t, id, at, at, 1, 100)
		b.outcome(t, id, status, nil)
	}
	acmeTokens := b.keys.Quota(org, org, policy.Tokens, month)
	require.NoError(t, b.rdb.Del(ctx, acmeTokens).Err())

	// broke: one request of 100 tokens that ended in 503, its counter unreadable.
	b.offset++
	_, err := b.pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, requests, tokens, kafka_partition, kafka_offset)
values ('broke-1', $1, $2, $1, 'broke', 'broke', 'org', '{broke}', 'test', 1, 100, 0, $3)`, b.cur, at, b.offset)
	require.NoError(t, err)
	b.outcome(t, "broke-1", 503, nil)
	brokeKey := b.keys.Quota("broke", "broke", policy.Tokens, month)
	require.NoError(t, b.rdb.Set(ctx, brokeKey, "1.38e+19", 0).Err())
	brokeRequests := b.keys.Quota("broke", "broke", policy.Requests, month) // pro: a requests quota
	require.NoError(t, b.rdb.Set(ctx, brokeRequests, 1, 0).Err())

	// huge: rows whose sum passes bigint (each row within it).
	_, err = b.pool.Exec(ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
  account_kind, path, source, tokens, kafka_partition, kafka_offset)
select 'huge-' || g, $1, $2, $1, 'huge', 'huge', 'org', '{huge}', 'test', 1000000000000000, 1, g
from generate_series(1, 9300) g`, b.cur, at)
	require.NoError(t, err)
	hugeKey := b.keys.Quota("huge", "huge", policy.Tokens, month)

	requireProblems := func(t *testing.T, problems []reconcile.Problem, want ...reconcile.Problem) {
		t.Helper()
		for _, w := range want {
			found := false
			for _, p := range problems {
				if p.Kind == w.Kind && p.Org == w.Org && p.Key == w.Key && (w.Value == "" || p.Value == w.Value) {
					found = true
				}
			}
			require.True(t, found, "problem %s %s %s in %v", w.Kind, w.Org, w.Key, problems)
		}
	}

	// verify: both reported, acme still compared (its counters hold the 503's units).
	diffs, problems, err := reconcile.Verify(ctx, b.opts())
	require.NoError(t, err)
	require.Len(t, problems, 2, "%v", problems)
	requireProblems(t, problems,
		reconcile.Problem{Kind: reconcile.BadCounter, Org: "broke", Key: brokeKey, Value: "1.38e+19"},
		reconcile.Problem{Kind: reconcile.BadTotal, Org: "huge", Key: hugeKey, Value: "9300000000000000000"})
	var got []string
	for _, d := range diffs {
		got = append(got, d.String())
	}
	require.ElementsMatch(t, []string{
		"acme acme requests " + month + ": redis 3, billable 2",
		"acme acme tokens " + month + ": redis 0, billable 200",
		"acme eng requests " + month + ": redis 3, billable 2",
		"acme eng tokens " + month + ": redis 300, billable 200",
		"broke broke requests " + month + ": redis 1, billable 0", // broke's good counter is checked too
	}, got)

	// A run: acme corrected, broke's refund refused by Redis and left pending, both reported.
	s, err := reconcile.Run(ctx, b.opts())
	require.ErrorIs(t, err, reconcile.ErrProblems)
	require.ErrorIs(t, err, reconcile.ErrInvariant, "broke's refund is not applied")
	require.Equal(t, 5, s.ByKind[reconcile.Refund5xx], "acme's at acme and eng, requests and tokens; broke's requests")
	require.Equal(t, 1, s.ByKind[reconcile.DriftRestore], "acme's lost tokens counter")
	require.Equal(t, int64(2), b.counter(t, org, policy.Requests, at))
	require.Equal(t, int64(200), b.counter(t, org, policy.Tokens, at))
	require.Len(t, s.Problems, 3, "%v", s.Problems)
	requireProblems(t, s.Problems,
		reconcile.Problem{Kind: reconcile.CorrectionFailed, Org: "broke", Key: brokeKey, Value: "1.38e+19"},
		reconcile.Problem{Kind: reconcile.BadCounter, Org: "broke", Key: brokeKey, Value: "1.38e+19"},
		reconcile.Problem{Kind: reconcile.BadTotal, Org: "huge", Key: hugeKey})
	require.Len(t, s.InvariantFailures, 1)
	require.Contains(t, s.InvariantFailures[0], "broke")
	require.Equal(t, "1.38e+19", b.rdb.Get(ctx, brokeKey).Val(), "a bad counter is reported, not changed")
	require.Equal(t, "0", b.rdb.Get(ctx, brokeRequests).Val(), "broke's good counter is corrected")
	_, err = b.rdb.Get(ctx, hugeKey).Result()
	require.True(t, errors.Is(err, redis.Nil), "no restore past the largest counter")

	// The operator deletes the bad counter: the next run applies the pending refund and
	// rebuilds the counter from the billing log (the 503 bills nothing: 0).
	require.NoError(t, b.rdb.Del(ctx, brokeKey).Err())
	s, err = reconcile.Run(ctx, b.opts())
	require.ErrorIs(t, err, reconcile.ErrProblems, "huge is still reported")
	require.NotErrorIs(t, err, reconcile.ErrInvariant)
	require.Equal(t, 1, s.Recovered)
	require.Len(t, s.Problems, 1)
	require.Equal(t, reconcile.BadTotal, s.Problems[0].Kind)
	require.Equal(t, "0", b.rdb.Get(ctx, brokeKey).Val())
	var applied int
	require.NoError(t, b.pool.QueryRow(ctx, `select count(*) from adjustments where org = 'broke' and applied_at is not null`).Scan(&applied))
	require.Equal(t, 3, applied, "the requests refund, the tokens refund, then the tokens restore")
}

// A counter holding any value that is not an integer within ±keyspace.MaxCounter is a
// bad_counter problem of verify, named by key and raw value; the org beside it is checked.
func TestVerifyReportsEveryShapeOfBadCounter(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	ctx := testenv.Context(t, time.Minute)
	at := b.cur.Add(time.Hour)
	b.event(t, "ev-1", at, at, 1, 10)
	month := period.MonthLabel(at)
	for name, value := range map[string]string{
		"float":         "1.38e+19",
		"text":          "abc",
		"past int64":    "99999999999999999999",
		"past 2^53 - 1": "9007199254740992",
	} {
		t.Run(name, func(t *testing.T) {
			key := b.keys.Quota(org, team, policy.Tokens, month)
			require.NoError(t, b.rdb.Set(ctx, key, value, 0).Err())
			diffs, problems, err := reconcile.Verify(ctx, b.opts())
			require.NoError(t, err)
			require.Empty(t, diffs, "acme's other counters are checked and equal")
			require.Len(t, problems, 1)
			require.Equal(t, reconcile.Problem{Kind: reconcile.BadCounter, Org: org, Account: team, Unit: policy.Tokens,
				Period: month, Key: key, Value: value, Error: problems[0].Error}, problems[0])
			require.True(t, strings.Contains(problems[0].String(), value), problems[0].String())
		})
	}
	// A stray counter (no usage in the log) of another type is reported too.
	stray := b.keys.Quota(org, user, policy.Tokens, month)
	require.NoError(t, b.rdb.HSet(ctx, stray, "x", 1).Err())
	require.NoError(t, b.rdb.Set(context.Background(), b.keys.Quota(org, team, policy.Tokens, month), 10, 0).Err())
	diffs, problems, err := reconcile.Verify(ctx, b.opts())
	require.NoError(t, err)
	require.Empty(t, diffs)
	require.Len(t, problems, 1)
	require.Equal(t, stray, problems[0].Key)
	require.Contains(t, problems[0].Error, "WRONGTYPE")
}

// A billable total within int64 but past keyspace.MaxCounter (ten requests of 10^15
// tokens) is a bad_total problem: no counter can hold it, so no restore is computed.
func TestTotalPastTheLargestCounter(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	ctx := testenv.Context(t, time.Minute)
	at := b.cur.Add(time.Hour)
	for i := range 10 {
		b.event(t, "ev-"+string(rune('a'+i)), at, at, 1, 1_000_000_000_000_000)
	}
	_, problems, err := reconcile.Verify(ctx, b.opts())
	require.NoError(t, err)
	require.Len(t, problems, 2, "acme's and eng's tokens: %v", problems)
	for _, p := range problems {
		require.Equal(t, reconcile.BadTotal, p.Kind)
		require.Equal(t, policy.Tokens, p.Unit)
		require.Equal(t, "10000000000000000", p.Value)
	}
	s, err := reconcile.Run(ctx, b.opts())
	require.ErrorIs(t, err, reconcile.ErrProblems)
	require.Zero(t, s.DriftFound)
	require.Equal(t, int64(10), b.counter(t, org, policy.Requests, at), "the requests counters are checked")
}
