package billinglog_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/billinglog"
	"github.com/metergate/metergate/internal/testenv"
)

// The meter's statements (internal/meter/sql), read rather than copied: the rows of these
// tests are written as the meter writes them.
var meterSQL = sync.OnceValues(func() (map[string]string, error) {
	out := map[string]string{}
	for _, name := range []string{"create_meter_usage", "insert_usage", "create_meter_outcomes", "insert_outcomes", "insert_voids"} {
		b, err := os.ReadFile(filepath.Join("..", "meter", "sql", name+".sql"))
		if err != nil {
			return nil, err
		}
		out[name] = string(b)
	}
	return out, nil
})

// The columns the meter copies into usage_events and into its staging table of admissions
// (internal/meter/store.go's usageColumns, without the message's own position).
var usageColumns = []string{"event_id", "billing_period", "event_time", "charged_period",
	"org", "account", "account_kind", "path", "api_key_id", "idempotency_key",
	"plan", "tool", "source", "fail_open",
	"requests", "tokens", "credits", "cost_micros", "kafka_partition", "kafka_offset", "shadow_refusal"}

// dailyBundle is an org of the test's own, its accounts' paths, and the days its events
// fall on: the last two of a month and the first two of the next (two partitions).
type dailyBundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	sql   map[string]string
	org   string
	paths [][]string
	start time.Time // the first day
	days  int
}

func setupDaily(t *testing.T) *dailyBundle {
	t.Helper()
	sqls, err := meterSQL()
	require.NoError(t, err)
	b := &dailyBundle{ctx: testenv.Context(t, 2*time.Minute), pool: testenv.Postgres(t), sql: sqls,
		org: strings.ReplaceAll(testenv.Name(t), "_", "-"), days: 4,
		start: time.Date(2031, time.January, 30, 0, 0, 0, 0, time.UTC)}
	o := b.org
	b.paths = [][]string{{o}, {o, o + "-t1"}, {o, o + "-t2"}, {o, o + "-t1", o + "-u1"}, {o, o + "-t1", o + "-u2"},
		{o, o + "-t2", o + "-u3"}, {o, o + "-t2", o + "-u3", o + "-a1"}}
	for _, m := range []time.Time{b.start, b.start.AddDate(0, 0, b.days-1)} {
		_, err := b.pool.Exec(b.ctx, `select usage_events_partition($1::date)`, m)
		require.NoError(t, err)
	}
	return b
}

// accounts are every account of the org.
func (b *dailyBundle) accounts() []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range b.paths {
		for _, a := range p {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out
}

// key is a row of usage_daily.
type dayKey struct {
	account string
	day     string
}

// requireExact checks, in one snapshot, that usage_daily (through billinglog.Daily) is
// what billable_events sums for every account of the org and every day.
func (b *dailyBundle) requireExact(t require.TestingT, msg string) {
	got, want := b.snapshot(t)
	require.Equal(t, want, got, msg)
}

// snapshot reads usage_daily and the sums of billable_events in one repeatable-read
// transaction.
func (b *dailyBundle) snapshot(t require.TestingT) (got, want map[dayKey][5]int64) {
	tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	rows, err := billinglog.Daily(b.ctx, tx, b.accounts(), b.start.AddDate(0, 0, -1), b.start.AddDate(0, 0, b.days+1))
	require.NoError(t, err)
	got = map[dayKey][5]int64{}
	for _, r := range rows {
		require.Equal(t, time.UTC, r.Day.Location())
		got[dayKey{r.Account, r.Day.Format(time.DateOnly)}] = [5]int64{r.Events, r.Requests, r.Tokens, r.Credits, r.CostMicros}
	}
	sums, err := tx.Query(b.ctx, `
select a.account, (e.event_time at time zone 'UTC')::date::text, count(*), sum(e.billable_requests)::bigint,
       sum(e.billable_tokens)::bigint, sum(e.billable_credits)::bigint, sum(e.billable_cost_micros)::bigint
from billable_events e cross join lateral unnest(e.path) a(account)
where e.path @> array[$1::text]
group by 1, 2`, b.org)
	require.NoError(t, err)
	want = map[dayKey][5]int64{}
	for sums.Next() {
		var k dayKey
		var v [5]int64
		require.NoError(t, sums.Scan(&k.account, &k.day, &v[0], &v[1], &v[2], &v[3], &v[4]))
		want[k] = v
	}
	require.NoError(t, sums.Err())
	return got, want
}

// usageEvent is a usage_events row; outcome and void the rows of the other two tables.
type usageEvent struct {
	id    string
	path  []string
	at    time.Time
	units [4]int64
}

type outcome struct {
	id     string
	status int
	units  [4]*int64 // nil: not reported
	at     time.Time // the outcome's time: its admission is looked for in the months around it first
}

// batch is what one of the meter's transactions writes.
type batch struct {
	admissions []usageEvent
	outcomes   []outcome
	voids      []string
}

// write writes bt as the meter's store.write does: admissions by COPY into usage_events,
// or, when one is a row already, the whole batch again through staging and ON CONFLICT DO
// NOTHING; then outcomes through staging, then voids. A deadlock is retried as the meter
// retries a batch.
func (b *dailyBundle) write(conn *pgxpool.Conn, bt batch) error {
	for attempt := 0; ; attempt++ {
		err := b.writeTx(conn, bt, attempt > 0)
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || (pe.Code != "23505" && pe.Code != "40P01") || attempt == 10 {
			return err
		}
	}
}

func (b *dailyBundle) writeTx(conn *pgxpool.Conn, bt batch, staged bool) error {
	return pgx.BeginFunc(b.ctx, conn, func(tx pgx.Tx) error {
		if len(bt.admissions) > 0 {
			rows := make([][]any, 0, len(bt.admissions))
			seen := map[string]bool{}
			for i, a := range bt.admissions {
				if seen[a.id] && !staged { // the meter copies an event's first delivery only
					continue
				}
				seen[a.id] = true
				month := time.Date(a.at.Year(), a.at.Month(), 1, 0, 0, 0, 0, time.UTC)
				rows = append(rows, []any{a.id, month, a.at, month, a.path[0], a.path[len(a.path)-1], "agent", a.path,
					nil, nil, "pro", nil, "node-1", false, a.units[0], a.units[1], a.units[2], a.units[3], 0, int64(i), nil})
			}
			if staged {
				if _, err := tx.Exec(b.ctx, b.sql["create_meter_usage"]); err != nil {
					return err
				}
				if _, err := tx.CopyFrom(b.ctx, pgx.Identifier{"meter_usage"}, usageColumns, pgx.CopyFromRows(rows)); err != nil {
					return err
				}
				if _, err := tx.Exec(b.ctx, b.sql["insert_usage"]); err != nil {
					return err
				}
			} else if _, err := tx.CopyFrom(b.ctx, pgx.Identifier{"usage_events"}, usageColumns, pgx.CopyFromRows(rows)); err != nil {
				return err
			}
		}
		if len(bt.outcomes) > 0 {
			if _, err := tx.Exec(b.ctx, b.sql["create_meter_outcomes"]); err != nil {
				return err
			}
			rows := make([][]any, len(bt.outcomes))
			for i, o := range bt.outcomes {
				rows[i] = []any{o.id, o.status, o.units[0], o.units[1], o.units[2], o.units[3], o.at, "node-1", 0, int64(i)}
			}
			cols := []string{"event_id", "status", "requests", "tokens", "credits", "cost_micros", "outcome_time", "source", "kafka_partition", "kafka_offset"}
			if _, err := tx.CopyFrom(b.ctx, pgx.Identifier{"meter_outcomes"}, cols, pgx.CopyFromRows(rows)); err != nil {
				return err
			}
			if _, err := tx.Exec(b.ctx, b.sql["insert_outcomes"]); err != nil {
				return err
			}
		}
		if len(bt.voids) > 0 {
			n := len(bt.voids)
			times, sources, reasons := make([]time.Time, n), make([]string, n), make([]string, n)
			parts, offsets := make([]int32, n), make([]int64, n)
			for i := range bt.voids {
				times[i], sources[i], reasons[i], offsets[i] = b.start, "node-1", "caller_gone", int64(i)
			}
			if _, err := tx.Exec(b.ctx, b.sql["insert_voids"], pgx.StrictNamedArgs{
				"event_ids": bt.voids, "attempts": bt.voids, "reasons": reasons, "void_times": times, "sources": sources,
				"kafka_partitions": parts, "kafka_offsets": offsets,
			}); err != nil {
				return err
			}
		}
		return nil
	})
}

// recordingT keeps what require reports, for a goroutine other than the test's.
type recordingT struct{ errs []error }

func (r *recordingT) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf(format, args...))
}

func (r *recordingT) FailNow() { runtime.Goexit() }

// randomUnits are an outcome's actual units: each reported or not.
func randomUnits(rng *rand.Rand) [4]*int64 {
	var u [4]*int64
	for i := range u {
		if rng.IntN(2) == 0 {
			v := rng.Int64N(5000)
			u[i] = &v
		}
	}
	return u
}

// The property: whatever the meter writes, in whatever order and however often, by
// several writers at once (admissions, outcomes of 2xx with or without actual units and of
// 5xx, voids, outcomes and voids before their admissions, messages delivered twice), and
// whatever is later updated or deleted, usage_daily is at every commit what billable_events
// sums, per account and day.
func TestUsageDailyIsTheBillingLogSummed(t *testing.T) {
	t.Parallel()
	b := setupDaily(t)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))

	// The messages: each admission, most with an outcome, some voided, some twice.
	type message struct {
		a    *usageEvent
		o    *outcome
		void string
	}
	var msgs []message
	for i := range 400 {
		a := usageEvent{id: fmt.Sprintf("%s-e%d", b.org, i), path: b.paths[rng.IntN(len(b.paths))],
			at:    b.start.Add(time.Duration(rng.Int64N(int64(b.days) * int64(24*time.Hour)))).Truncate(time.Microsecond),
			units: [4]int64{1, rng.Int64N(10000), rng.Int64N(10), rng.Int64N(100000)}}
		for range 1 + rng.IntN(4)/3 {
			msgs = append(msgs, message{a: &a})
		}
		if rng.IntN(10) < 7 {
			at := a.at.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)
			if rng.IntN(10) == 0 { // reported months later, or with a clock months behind
				at = a.at.AddDate(0, 3-rng.IntN(7), 0)
			}
			o := outcome{id: a.id, status: 200, units: randomUnits(rng), at: at}
			if rng.IntN(5) == 0 {
				o = outcome{id: a.id, status: 500 + rng.IntN(4), units: randomUnits(rng), at: at}
			}
			msgs = append(msgs, message{o: &o})
			if rng.IntN(5) == 0 { // a second outcome, which loses to whichever is written first
				msgs = append(msgs, message{o: &outcome{id: a.id, status: 200 + rng.IntN(400), units: randomUnits(rng), at: a.at}})
			}
		}
		if rng.IntN(7) == 0 {
			for range 1 + rng.IntN(2) {
				msgs = append(msgs, message{void: a.id})
			}
		}
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })

	// Batches of 1 to 40 messages, written by 4 writers at once while a reader checks.
	const writers = 4
	queues := make([][]batch, writers)
	for i, w := 0, 0; i < len(msgs); w = (w + 1) % writers {
		n := min(len(msgs)-i, 1+rng.IntN(40))
		var bt batch
		for _, m := range msgs[i : i+n] {
			switch {
			case m.a != nil:
				bt.admissions = append(bt.admissions, *m.a)
			case m.o != nil:
				bt.outcomes = append(bt.outcomes, *m.o)
			default:
				bt.voids = append(bt.voids, m.void)
			}
		}
		queues[w] = append(queues[w], bt)
		i += n
	}
	done := make(chan struct{})
	checked := make(chan error, 1)
	checks := 0
	go func() { // one snapshot after another, each exact
		var rt recordingT
		var err error
		defer func() { checked <- errors.Join(append(rt.errs, err)...) }() // also after rt's FailNow
		for {
			select {
			case <-done:
				return
			default:
			}
			got, want := b.snapshot(&rt)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				err = fmt.Errorf("a snapshot while writing differs:\nusage_daily     %v\nbillable_events %v", got, want)
				return
			}
			checks++
		}
	}()
	errs := make(chan error, writers)
	for _, q := range queues {
		go func() {
			conn, err := b.pool.Acquire(b.ctx)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Release()
			for _, bt := range q {
				if err := b.write(conn, bt); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		require.NoError(t, <-errs)
	}
	close(done)
	require.NoError(t, <-checked)
	t.Logf("%d messages; %d snapshots checked while writing", len(msgs), checks)
	b.requireExact(t, "after every message")
	var voided, refunded int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) filter (where void_reason is not null), count(*) filter (where outcome_status >= 500)
		from billable_events where org = $1`, b.org).Scan(&voided, &refunded))
	require.Positive(t, voided, "some events voided")
	require.Positive(t, refunded, "some events refunded")

	// Changes nothing in the services makes, and the rollup follows them.
	for _, sql := range []string{
		`update usage_outcomes set tokens = coalesce(tokens, 0) + 7, status = case when status >= 500 then 200 else status end
		 where event_id in (select event_id from usage_events where org = $1 and kafka_offset % 3 = 0)`,
		`delete from usage_voids where event_id in (select event_id from usage_events where org = $1 and kafka_offset % 2 = 0)`,
		`update usage_events set event_time = event_time + interval '1 hour', requests = requests + 1
		 where org = $1 and kafka_offset % 5 = 0 and event_time < billing_period + interval '1 month' - interval '1 hour'`,
		`delete from usage_outcomes where event_id in (select event_id from usage_events where org = $1 and kafka_offset % 7 = 0)`,
		`delete from usage_events where org = $1 and kafka_offset % 11 = 0`,
		// More events than one transaction locks one by one: the writers' lock instead.
		`insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path, source,
		   requests, tokens, kafka_partition, kafka_offset)
		 select $1 || '-bulk' || i, '2031-02-01', '2031-02-01T12:00:00Z', '2031-02-01', $1, $1 || '-t1', 'team', array[$1, $1 || '-t1'],
		   'test', 1, i, 0, i
		 from generate_series(1, 2500) i`,
		`insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
		 select $1 || '-bulk' || i, case when i % 4 = 0 then 503 else 200 end, 10, now(), 'test', 0, i
		 from generate_series(1, 2500, 2) i`,
	} {
		_, err := b.pool.Exec(b.ctx, sql, b.org)
		require.NoError(t, err, sql)
		b.requireExact(t, sql)
	}

	// Inserts (counted at COMMIT), changes of the same rows (counted at once) and a rebuild
	// in one transaction.
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for _, sql := range []string{
			`insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path, source,
			   requests, tokens, credits, kafka_partition, kafka_offset)
			 select $1 || '-mixed' || i, '2031-01-01', '2031-01-31T10:00:00Z', '2031-01-01', $1, $1 || '-t2', 'team', array[$1, $1 || '-t2'],
			   'test', 1, 100 * i, 1, 0, i
			 from generate_series(1, 6) i`,
			`insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
			 select $1 || '-mixed' || i, case when i = 2 then 502 else 200 end, 7 * i, now(), 'test', 0, i from generate_series(1, 4) i`,
			// The rollup recomputed from the log: what the transaction queued is in it.
			`select usage_daily_rebuild(), $1::text`,
			`update usage_outcomes set tokens = tokens + 1000 where event_id in ($1 || '-mixed1', $1 || '-mixed2')`,
			`insert into usage_voids (event_id, attempt, reason, void_time, source, kafka_partition, kafka_offset)
			 select $1 || '-mixed' || i, 'x', 'unavailable', now(), 'test', 0, i from generate_series(3, 5) i`,
			`delete from usage_voids where event_id = $1 || '-mixed4'`,
			`update usage_events set tokens = tokens + 1 where event_id = $1 || '-mixed5'`,
			`delete from usage_events where event_id = $1 || '-mixed6'`,
			`insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
			 values ($1 || '-mixed5', 200, 1, now(), 'test', 0, 5)`,
		} {
			if _, err := tx.Exec(b.ctx, sql, b.org); err != nil {
				return fmt.Errorf("%s: %w", sql, err)
			}
		}
		return nil
	}))
	b.requireExact(t, "inserts, updates, deletes of the same rows and a rebuild in one transaction")
}

// race writes first in one transaction and second in another at once, each counted into
// usage_daily as at its COMMIT (SET CONSTRAINTS ALL IMMEDIATE runs the deferred flush now),
// then commits the first, then the second. Second's flush is let run until it either
// completes or waits for a lock (the flush makes it wait for the first transaction).
func (b *dailyBundle) race(t *testing.T, first, second func(tx pgx.Tx) error) {
	t.Helper()
	flushed := func(write func(tx pgx.Tx) error) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error {
			if err := write(tx); err != nil {
				return err
			}
			_, err := tx.Exec(b.ctx, `set constraints all immediate`)
			return err
		}
	}
	first, second = flushed(first), flushed(second)
	tx1, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx1.Rollback(b.ctx) }()
	require.NoError(t, first(tx1))

	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	tx2, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx2.Rollback(b.ctx) }()
	done := make(chan error, 1)
	go func() { done <- second(tx2) }()
	var secondErr error
	committed := false
	for completed := false; !completed && !committed; {
		select {
		case secondErr = <-done:
			completed = true
			continue
		case <-b.ctx.Done():
			t.Fatal("the second statement neither waited nor completed")
		case <-time.After(time.Millisecond):
		}
		var waiting bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `select coalesce(bool_or(wait_event_type = 'Lock'), false) from pg_stat_activity where pid = $1`, pid).Scan(&waiting))
		if waiting {
			require.NoError(t, tx1.Commit(b.ctx))
			committed = true
			secondErr = <-done
		}
	}
	require.NoError(t, secondErr)
	if !committed {
		require.NoError(t, tx1.Commit(b.ctx))
	}
	require.NoError(t, tx2.Commit(b.ctx))
}

// Two transactions writing rows of one event at the same time, neither seeing the other's
// until it commits: the second to commit must count the first's.
func TestUsageDailyConcurrentWritesOfOneEvent(t *testing.T) {
	t.Parallel()
	b := setupDaily(t)
	n := 0
	event := func() (usageEvent, func(tx pgx.Tx) error) {
		n++
		a := usageEvent{id: fmt.Sprintf("%s-e%d", b.org, n), path: b.paths[4], at: b.start.Add(time.Hour), units: [4]int64{1, 1000, 2, 300}}
		return a, func(tx pgx.Tx) error {
			_, err := tx.Exec(b.ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
			  account_kind, path, source, requests, tokens, credits, cost_micros, kafka_partition, kafka_offset)
			values ($1, '2031-01-01', $2, '2031-01-01', $3, $4, 'user', $5, 'test', $6, $7, $8, $9, 0, 0)`,
				a.id, a.at, a.path[0], a.path[len(a.path)-1], a.path, a.units[0], a.units[1], a.units[2], a.units[3])
			return err
		}
	}
	outcome := func(id string, status int, tokens int64) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(b.ctx, `insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
				values ($1, $2, $3, now(), 'test', 0, 0)`, id, status, tokens)
			return err
		}
	}
	void := func(id string) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(b.ctx, `insert into usage_voids (event_id, attempt, reason, void_time, source, kafka_partition, kafka_offset)
				values ($1, $1, 'unavailable', now(), 'test', 0, 0)`, id)
			return err
		}
	}

	for _, c := range []struct {
		name string
		race func(a usageEvent, insert func(pgx.Tx) error)
	}{
		{"admission, then its outcome", func(a usageEvent, insert func(pgx.Tx) error) {
			b.race(t, insert, outcome(a.id, 200, 1500))
		}},
		{"outcome, then its admission", func(a usageEvent, insert func(pgx.Tx) error) {
			b.race(t, outcome(a.id, 200, 1500), insert)
		}},
		{"void, then its admission", func(a usageEvent, insert func(pgx.Tx) error) {
			b.race(t, void(a.id), insert)
		}},
		{"outcome, then a void", func(a usageEvent, insert func(pgx.Tx) error) {
			require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, insert))
			b.race(t, outcome(a.id, 200, 1500), void(a.id))
		}},
		{"void, then a 5xx outcome", func(a usageEvent, insert func(pgx.Tx) error) {
			require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, insert))
			b.race(t, void(a.id), outcome(a.id, 503, 0))
		}},
		{"a bulk load of admissions, then an outcome of one", func(a usageEvent, _ func(pgx.Tx) error) {
			bulk := func(tx pgx.Tx) error { // more events than a transaction locks one by one
				_, err := tx.Exec(b.ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
				  account_kind, path, source, requests, tokens, kafka_partition, kafka_offset)
				select $1 || '-' || i, '2031-01-01', $2, '2031-01-01', $3, $4, 'user', $5, 'test', 1, 1000, 0, i
				from generate_series(1, 2500) i`, a.id, a.at, a.path[0], a.path[len(a.path)-1], a.path)
				return err
			}
			b.race(t, bulk, outcome(a.id+"-7", 200, 1500))
		}},
	} {
		a, insert := event()
		c.race(a, insert)
		b.requireExact(t, c.name)
	}
}

// A day's usage past bigint, which the log holds row by row, is kept (the meter is not
// stopped by its sum): the view has it, and Daily says it cannot be an int64.
func TestUsageDailyPastBigint(t *testing.T) {
	t.Parallel()
	b := setupDaily(t)
	_, err := b.pool.Exec(b.ctx, `insert into usage_events (event_id, billing_period, event_time, charged_period, org, account,
	  account_kind, path, source, tokens, kafka_partition, kafka_offset)
	select $1 || '-e' || i, '2031-01-01', '2031-01-30T12:00:00Z', '2031-01-01', $1, $1, 'org', array[$1], 'test', 4000000000000000000, 0, i
	from generate_series(1, 3) i`, b.org)
	require.NoError(t, err)
	var tokens string
	require.NoError(t, b.pool.QueryRow(b.ctx, `select tokens::text from usage_daily where account = $1`, b.org).Scan(&tokens))
	require.Equal(t, "12000000000000000000", tokens)
	_, err = billinglog.Daily(b.ctx, b.pool, []string{b.org}, b.start, b.start.AddDate(0, 0, 1))
	require.Error(t, err)
}
