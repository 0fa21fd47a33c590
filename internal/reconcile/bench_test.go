package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/reconcile"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

// benchCase is the data one sub-benchmark of BenchmarkReconcile reconciles.
type benchCase struct {
	// accounts are active: orgs on the pro plan (monthly requests and tokens quotas), each
	// with one admitted request in the open month, its outcome and its two counters in Redis.
	accounts int
	// corrections of those accounts need one: half a 5xx outcome (refund_5xx of requests and
	// tokens, two rows), half actual tokens below the estimate (settle_tokens, one row).
	corrections int
	// inactive accounts were seen before the open months only: an account row, one request
	// in one of the six closed months before them, its outcome and its applied settlement.
	inactive int
}

func (c benchCase) name() string {
	n := fmt.Sprintf("accounts=%d/corrections=%d", c.accounts, c.corrections)
	if c.inactive > 0 {
		n += fmt.Sprintf("/inactive=%d", c.inactive)
	}
	return n
}

// adjustments is how many rows a run applies: two per refund, one per settlement.
func (c benchCase) adjustments() int { return c.corrections/2*2 + (c.corrections - c.corrections/2) }

// BenchmarkReconcile times one reconcile.Run per op over accounts of which some need a
// correction; between ops (timer stopped) the run's corrections are deleted and undone in
// Redis, so every op finds and applies the same ones. Run it as
//
//	go test -run '^$' -bench Reconcile -benchtime 3x ./internal/reconcile/
//
// Metrics: s (the median seconds of one run over the ops; ns/op is the mean), adjustments
// (rows applied per run) and x_baseline (s over the s of accounts=100000/corrections=1000
// measured in the same process, when it ran first: the machines are noisy). s of
// accounts=100000/corrections=1000 is reconcile_s_100k. A run's time should follow the
// active accounts and the corrections; the inactive case shows that accounts seen only in
// closed months cost nothing.
func BenchmarkReconcile(b *testing.B) {
	baselineCase := benchCase{accounts: 100_000, corrections: 1_000}
	var baseline float64
	for _, c := range []benchCase{
		baselineCase,
		{accounts: 10_000, corrections: 1_000},
		{accounts: 100_000, corrections: 2_000},
		{accounts: 100_000, corrections: 1_000, inactive: 1_000_000},
	} {
		b.Run(c.name(), func(b *testing.B) {
			b.ReportAllocs()
			env := seedBench(b, c)
			ctx := testenv.Context(b, 30*time.Minute)
			o := reconcile.Options{Pool: env.pool, Redis: env.rdb, Keys: env.keys, Policies: env.cache, Clock: period.Fixed(env.now)}
			var runs []float64
			for b.Loop() {
				start := time.Now()
				s, err := reconcile.Run(ctx, o)
				runs = append(runs, time.Since(start).Seconds())
				b.StopTimer()
				if err != nil {
					b.Fatalf("run: %v", err)
				}
				if s.AdjustmentsApplied != c.adjustments() || s.DriftFound != 0 || s.EventsSkipped != 0 {
					b.Fatalf("run applied %d adjustments (want %d), drift %d, skipped %d: %+v",
						s.AdjustmentsApplied, c.adjustments(), s.DriftFound, s.EventsSkipped, s.ByKind)
				}
				env.undo(ctx, b, s.RunID)
				b.StartTimer()
			}
			slices.Sort(runs)
			sec := runs[len(runs)/2]
			b.ReportMetric(sec, "s")
			b.ReportMetric(float64(c.adjustments()), "adjustments")
			if c == baselineCase {
				baseline = sec
			}
			if baseline > 0 {
				b.ReportMetric(sec/baseline, "x_baseline")
			}
		})
	}
}

type benchEnv struct {
	pool  *pgxpool.Pool
	rdb   *redis.Client
	keys  keyspace.Keys
	cache *policy.Cache
	now   time.Time
}

// seedBench fills a schema of its own and a key prefix of its own with c's data, in
// server-side statements and Redis pipelines. The run's time is the 15th of this month at
// noon UTC, so every case has the same share of its events in the open days.
func seedBench(b *testing.B, c benchCase) *benchEnv {
	b.Helper()
	ctx := testenv.Context(b, 20*time.Minute)
	pool, _ := testenv.EmptySchema(b)
	if _, err := migrations.Up(ctx, pool); err != nil {
		b.Fatalf("migrate: %v", err)
	}
	prefix := testenv.Prefix(b)
	env := &benchEnv{pool: pool, rdb: testenv.Redis(b), keys: keyspace.Keys{Prefix: prefix + "mg", Shards: 16}}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := deletePrefix(ctx, env.rdb, prefix); err != nil {
			b.Errorf("delete bench keys: %v", err)
		}
	})
	t := time.Now().UTC()
	cur := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	env.now = cur.AddDate(0, 0, 14).Add(12 * time.Hour)
	step := c.accounts / c.corrections

	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("seed: %v\n%s", err, sql)
		}
	}
	for m := range 8 {
		exec(`select usage_events_partition($1)`, cur.AddDate(0, -m, 0))
	}
	exec(`insert into plan_limits (plan, unit, quota, quota_period) values ('pro', 'tokens', 1000000000, 'month')`)
	exec(`insert into accounts (id, kind, org, plan) select 'a' || i, 'org', 'a' || i, 'pro' from generate_series(1, $1::int) i`, c.accounts)
	// One request each, spread over the month up to the run's time: 1 request, 1,000 tokens
	// estimated. Outcomes: 200 without actual units, except the corrections (every step-th
	// account): 503, or 200 with 800 actual tokens.
	exec(`insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path,
  source, requests, tokens, kafka_partition, kafka_offset)
select 'e' || i, $2::date, $2::timestamptz + ($3::timestamptz - $2::timestamptz) * (i::float8 / ($1::int + 1)), $2::date,
       'a' || i, 'a' || i, 'org', array['a' || i], 'bench', 1, 1000, 0, i
from generate_series(1, $1::int) i`, c.accounts, cur, env.now)
	exec(`insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
select 'e' || i,
       case when i % $2::int = 0 and (i / $2::int) % 2 = 1 then 503 else 200 end,
       case when i % $2::int = 0 and (i / $2::int) % 2 = 0 then 800 end,
       now(), 'bench', 1, i
from generate_series(1, $1::int) i`, c.accounts, step)
	if c.inactive > 0 {
		exec(`insert into accounts (id, kind, org, plan) select 'z' || i, 'org', 'z' || i, 'pro' from generate_series(1, $1::int) i`, c.inactive)
		exec(`insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path,
  source, requests, tokens, kafka_partition, kafka_offset)
select 'y' || i, p, (p::timestamp + make_interval(secs => i % 2000000)) at time zone 'UTC', p,
       'z' || i, 'z' || i, 'org', array['z' || i], 'bench', 1, 1000, 2, i
from (select i, ($2::date - make_interval(months => 2 + i % 6))::date as p from generate_series(1, $1::int) i) g`, c.inactive, cur)
		exec(`insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
select 'y' || i, 200, 900, now(), 'bench', 3, i from generate_series(1, $1::int) i`, c.inactive)
		exec(`insert into reconcile_runs (run_id, started_at, finished_at) values ('00000000-0000-0000-0000-000000000001', $1, $1)`, cur.AddDate(0, -1, 0))
		exec(`insert into adjustments (run_id, kind, org, account, level, unit, quota_period, period, amount, redis_before, redis_after,
  reason, source_event, created_at, applied_at)
select '00000000-0000-0000-0000-000000000001', 'settle_tokens', 'z' || i, 'z' || i, 'org', 'tokens', 'month', p, -100, 1000, 900,
       'estimated 1000, actual 900', 'y' || i, p + interval '1 day', p + interval '1 day'
from (select i, ($2::date - make_interval(months => 2 + i % 6))::date as p from generate_series(1, $1::int) i) g`, c.inactive, cur)
	}
	// As autovacuum would have left them: statistics and visibility maps.
	for _, table := range []string{"accounts", "usage_events", "usage_outcomes", "adjustments", "reconcile_runs"} {
		exec(`vacuum analyze ` + table)
	}

	// The counters admission charged: 1 request and 1,000 tokens per account.
	label := period.MonthLabel(cur)
	pipe := env.rdb.Pipeline()
	for i := 1; i <= c.accounts; i++ {
		acc := fmt.Sprintf("a%d", i)
		pipe.Set(ctx, env.keys.Quota(acc, acc, policy.Requests, label), 1, 40*24*time.Hour)
		pipe.Set(ctx, env.keys.Quota(acc, acc, policy.Tokens, label), 1000, 40*24*time.Hour)
		if pipe.Len() >= 10_000 || i == c.accounts {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatalf("seed counters: %v", err)
			}
		}
	}

	env.cache = policy.NewCache(pool, nil, time.Hour)
	if err := env.cache.Reload(ctx); err != nil {
		b.Fatalf("load policies: %v", err)
	}
	return env
}

// undo deletes the corrections of a run and reverses them in Redis, so the next run finds
// the same ones to make.
func (env *benchEnv) undo(ctx context.Context, b *testing.B, runID string) {
	b.Helper()
	rows, err := env.pool.Query(ctx, `delete from adjustments where run_id = $1
returning org, account, unit, to_char(period, case quota_period when 'day' then 'YYYY-MM-DD' else 'YYYY-MM' end), amount`, runID)
	if err != nil {
		b.Fatalf("undo run: %v", err)
	}
	pipe := env.rdb.Pipeline()
	for rows.Next() {
		var (
			org, account, label string
			unit                policy.Unit
			amount              int64
		)
		if err := rows.Scan(&org, &account, &unit, &label, &amount); err != nil {
			b.Fatalf("undo run: %v", err)
		}
		pipe.IncrBy(ctx, env.keys.Quota(org, account, unit, label), -amount)
	}
	if err := rows.Err(); err != nil {
		b.Fatalf("undo run: %v", err)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		b.Fatalf("undo run in redis: %v", err)
	}
}

// deletePrefix deletes every key under prefix.
func deletePrefix(ctx context.Context, rdb *redis.Client, prefix string) error {
	iter := rdb.Scan(ctx, 0, prefix+"*", 10_000).Iterator()
	pipe := rdb.Pipeline()
	for iter.Next(ctx) {
		pipe.Unlink(ctx, iter.Val())
		if pipe.Len() >= 10_000 {
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	_, err := pipe.Exec(ctx)
	return err
}
