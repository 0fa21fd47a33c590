package meter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
	"github.com/metergate/metergate/pkg/event"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// testBundle is one test's topic, database and producer.
type testBundle struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	brokers []string
	topic   string
	name    string // unique to the test: a prefix for orgs, event ids and groups
	writer  *kafka.Writer
}

func setup(t *testing.T, partitions int) *testBundle {
	t.Helper()
	b := &testBundle{
		ctx:     testenv.Context(t, 2*time.Minute),
		pool:    testenv.Postgres(t),
		brokers: testenv.KafkaBrokers(t),
		topic:   testenv.Topic(t, partitions),
		name:    strings.ReplaceAll(testenv.Name(t), "_", "-"),
	}
	b.writer = &kafka.Writer{
		Addr: kafka.TCP(b.brokers...), Topic: b.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: time.Millisecond, BatchBytes: 16 << 20,
	}
	t.Cleanup(func() { _ = b.writer.Close() })
	return b
}

// produce writes msgs, acknowledged by every replica.
func (b *testBundle) produce(t testing.TB, msgs ...kafka.Message) {
	t.Helper()
	require.NoError(t, b.writer.WriteMessages(b.ctx, msgs...))
}

// options are a meter's options for this test; the group is new unless named.
func (b *testBundle) options(group string) Options {
	return Options{Brokers: b.brokers, Topic: b.topic, Group: b.name + "-" + group,
		SessionTimeout: 6 * time.Second, FlushTimeout: 5 * time.Second}
}

// running is a Meter started by start.
type running struct {
	*Meter
	reg  *prometheus.Registry
	stop func() error
}

// start runs a meter with opts until stop (or the test's end) and returns it.
func start(t *testing.T, pool *pgxpool.Pool, opts Options) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	m, err := New(pool, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(time.Minute):
				runErr = fmt.Errorf("meter still running a minute after its context ended")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return &running{Meter: m, reg: reg, stop: stop}
}

func (r *running) inserted(table string) int64 {
	return int64(testutil.ToFloat64(r.metrics.rows.WithLabelValues(table)))
}

func (r *running) duplicates(table string) int64 {
	return int64(testutil.ToFloat64(r.metrics.duplicates.WithLabelValues(table)))
}

func (r *running) messages() int64 { return int64(testutil.ToFloat64(r.metrics.messages)) }

// waitFor polls cond until it holds, failing the test at ctx's end.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func count(t *testing.T, ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
	return n
}

// admittedEvent returns a valid admission of account (path org first) at at.
func admittedEvent(t testing.TB, id string, at time.Time, path []event.PathNode, u map[string]int64) event.CloudEvent {
	t.Helper()
	ev, err := event.New(id, "node-1", event.TypeAdmitted, event.Subject(path), at, event.Admitted{
		Org: path[0].Account, Account: path[len(path)-1].Account, Path: path,
		Units: u, Period: period.MonthLabel(at), Plan: "pro",
	})
	require.NoError(t, err)
	return ev
}

func outcomeEvent(t testing.TB, eventID string, at time.Time, status int, u map[string]int64) event.CloudEvent {
	t.Helper()
	ev, err := event.New(eventID+outcomeSuffix, "node-2", event.TypeOutcome, "", at, event.Outcome{EventID: eventID, Status: status, Units: u})
	require.NoError(t, err)
	return ev
}

func message(t testing.TB, org string, ev event.CloudEvent) kafka.Message {
	t.Helper()
	v, err := json.Marshal(ev)
	require.NoError(t, err)
	return kafka.Message{Key: []byte(org), Value: v}
}

func orgPath(org string) []event.PathNode {
	return []event.PathNode{{Account: org, Kind: "org"}, {Account: org + "-team", Kind: "team"}, {Account: org + "-agent", Kind: "agent"}}
}

// positions reads the whole topic without a group: event id → Kafka partition and offset.
func positions(t *testing.T, b *testBundle, partitions int) map[string][2]int64 {
	t.Helper()
	out := map[string][2]int64{}
	for p := range partitions {
		conn, err := kafka.DialLeader(b.ctx, "tcp", b.brokers[0], b.topic, p)
		require.NoError(t, err)
		last, err := conn.ReadLastOffset()
		require.NoError(t, err)
		for next := int64(0); next < last; {
			_, err := conn.Seek(next, kafka.SeekAbsolute)
			require.NoError(t, err)
			batch := conn.ReadBatch(1, 16<<20)
			for {
				msg, err := batch.ReadMessage()
				if err != nil {
					break
				}
				var ce struct{ ID string }
				require.NoError(t, json.Unmarshal(msg.Value, &ce))
				out[ce.ID] = [2]int64{int64(p), msg.Offset}
				next = msg.Offset + 1
			}
			_ = batch.Close()
		}
		_ = conn.Close()
	}
	return out
}

// N events (admissions and outcomes) produced once are N rows, each at its own Kafka
// position, every column as produced. A second consumer group reading the topic again from
// the first offset into the same tables adds nothing, and counts N duplicates.
func TestEveryEventOnceEvenWhenConsumedTwice(t *testing.T) {
	t.Parallel()
	const partitions, orgs, admissions = 4, 8, 2000
	b := setup(t, partitions)
	now := time.Now().UTC().Truncate(time.Microsecond)

	var msgs []kafka.Message
	outcomes := 0
	for i := range admissions {
		org := fmt.Sprintf("%s-o%d", b.name, i%orgs)
		id := fmt.Sprintf("%s-e%d", b.name, i)
		msgs = append(msgs, message(t, org, admittedEvent(t, id, now.Add(-time.Duration(i)*time.Millisecond), orgPath(org), map[string]int64{"requests": 1, "tokens": int64(i)})))
		if i%2 == 0 {
			msgs = append(msgs, message(t, org, outcomeEvent(t, id, now, 200+i%400, map[string]int64{"tokens": int64(i / 2)})))
			outcomes++
		}
	}
	// One event with every field set, for the full-row check.
	full := fmt.Sprintf("%s-full", b.name)
	fullOrg := b.name + "-o0"
	fullPath := []event.PathNode{{Account: fullOrg, Kind: "org"}, {Account: "eng", Kind: "team"}, {Account: "alice", Kind: "user"}, {Account: "agent-1", Kind: "agent"}}
	fullAt := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 123456000, time.UTC)
	fullEv, err := event.New(full, "admit-7", event.TypeAdmitted, event.Subject(fullPath), fullAt, event.Admitted{
		Org: fullOrg, Account: "agent-1", Path: fullPath, APIKeyID: "key_d08a26640bf29096", IdempotencyKey: "req-7f3a",
		Units:  map[string]int64{"requests": 1, "tokens": 2500, "credits": 3, "cost_micros": 4200},
		Period: period.MonthLabel(fullAt.AddDate(0, -1, 0)), Plan: "enterprise", Tool: "llm_call", FailOpen: true,
	})
	require.NoError(t, err)
	msgs = append(msgs, message(t, fullOrg, fullEv))
	n := len(msgs)
	b.produce(t, msgs...)

	first := start(t, b.pool, b.options("first"))
	ownRows := `select count(*) from usage_events where org like $1`
	ownOutcomes := `select count(*) from usage_outcomes where event_id like $1`
	like := b.name + "-%"
	waitFor(t, b.ctx, "every row", func() bool {
		return count(t, b.ctx, b.pool, ownRows, like)+count(t, b.ctx, b.pool, ownOutcomes, like) == int64(n)
	})
	require.EqualValues(t, admissions+1, count(t, b.ctx, b.pool, ownRows, like))
	require.EqualValues(t, outcomes, count(t, b.ctx, b.pool, ownOutcomes, like))
	waitFor(t, b.ctx, "the metrics", func() bool { return first.messages() == int64(n) })
	require.EqualValues(t, admissions+1, first.inserted("usage_events"))
	require.EqualValues(t, outcomes, first.inserted("usage_outcomes"))
	require.Zero(t, first.duplicates("usage_events")+first.duplicates("usage_outcomes"))

	// Every row was written from its own message.
	pos := positions(t, b, partitions)
	require.Len(t, pos, n)
	rows, err := b.pool.Query(b.ctx, `select event_id, kafka_partition, kafka_offset from usage_events where org like $1
		union all select event_id || '/outcome', kafka_partition, kafka_offset from usage_outcomes where event_id like $1`, like)
	require.NoError(t, err)
	seen := 0
	for rows.Next() {
		var id string
		var p, o int64
		require.NoError(t, rows.Scan(&id, &p, &o))
		require.Equal(t, pos[id], [2]int64{p, o}, id)
		seen++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, n, seen)
	// What an event leaves out is NULL, not ''.
	require.Positive(t, count(t, b.ctx, b.pool, `select count(*) from usage_events where org like $1
		and api_key_id is null and idempotency_key is null and tool is null`, like))
	require.Zero(t, count(t, b.ctx, b.pool, `select count(*) from usage_events where org like $1
		and '' in (api_key_id, idempotency_key, plan, tool)`, like))

	// The full row.
	type usage struct {
		EventID, Org, Account, AccountKind, Source               string
		BillingPeriod, EventTime, ChargedPeriod                  time.Time
		Path                                                     []string
		APIKeyID, IdempotencyKey, Plan, Tool                     *string
		FailOpen, Late                                           bool
		Requests, Tokens, Credits, CostMicros, Partition, Offset int64
	}
	var got usage
	var ingest time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `select event_id, org, account, account_kind, source, billing_period, event_time,
		charged_period, path, api_key_id, idempotency_key, plan, tool, fail_open, late, requests, tokens, credits, cost_micros,
		kafka_partition, kafka_offset, ingest_time from usage_events where event_id = $1`, full).Scan(
		&got.EventID, &got.Org, &got.Account, &got.AccountKind, &got.Source, &got.BillingPeriod, &got.EventTime,
		&got.ChargedPeriod, &got.Path, &got.APIKeyID, &got.IdempotencyKey, &got.Plan, &got.Tool, &got.FailOpen, &got.Late,
		&got.Requests, &got.Tokens, &got.Credits, &got.CostMicros, &got.Partition, &got.Offset, &ingest))
	str := func(s string) *string { return &s }
	month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	require.Equal(t, usage{
		EventID: full, Org: fullOrg, Account: "agent-1", AccountKind: "agent", Source: "admit-7",
		BillingPeriod: month, EventTime: fullAt, ChargedPeriod: month.AddDate(0, -1, 0),
		Path:     []string{fullOrg, "eng", "alice", "agent-1"},
		APIKeyID: str("key_d08a26640bf29096"), IdempotencyKey: str("req-7f3a"), Plan: str("enterprise"), Tool: str("llm_call"),
		FailOpen: true, Requests: 1, Tokens: 2500, Credits: 3, CostMicros: 4200,
		Partition: pos[full][0], Offset: pos[full][1],
	}, usage{
		EventID: got.EventID, Org: got.Org, Account: got.Account, AccountKind: got.AccountKind, Source: got.Source,
		BillingPeriod: got.BillingPeriod.UTC(), EventTime: got.EventTime.UTC(), ChargedPeriod: got.ChargedPeriod.UTC(),
		Path: got.Path, APIKeyID: got.APIKeyID, IdempotencyKey: got.IdempotencyKey, Plan: got.Plan, Tool: got.Tool,
		FailOpen: got.FailOpen, Late: got.Late, Requests: got.Requests, Tokens: got.Tokens, Credits: got.Credits,
		CostMicros: got.CostMicros, Partition: got.Partition, Offset: got.Offset,
	})
	require.WithinDuration(t, time.Now(), ingest, time.Minute)

	// An outcome row: status and actual units, missing units NULL.
	var status int
	var tokens, requests *int64
	var outcomeTime time.Time
	var source string
	require.NoError(t, b.pool.QueryRow(b.ctx, `select status, tokens, requests, outcome_time, source from usage_outcomes where event_id = $1`,
		b.name+"-e10").Scan(&status, &tokens, &requests, &outcomeTime, &source))
	require.Equal(t, 210, status)
	require.NotNil(t, tokens)
	require.EqualValues(t, 5, *tokens)
	require.Nil(t, requests, "a unit the outcome did not report is NULL")
	require.Equal(t, now, outcomeTime.UTC())
	require.Equal(t, "node-2", source)

	// A second group reads everything again into the same tables: nothing new, N duplicates.
	again := start(t, b.pool, b.options("again"))
	waitFor(t, b.ctx, "the second group to consume everything", func() bool { return again.messages() == int64(n) })
	require.Zero(t, again.inserted("usage_events")+again.inserted("usage_outcomes"))
	require.EqualValues(t, n, again.duplicates("usage_events")+again.duplicates("usage_outcomes"))
	require.EqualValues(t, admissions+1, count(t, b.ctx, b.pool, ownRows, like))
	require.EqualValues(t, admissions+1, count(t, b.ctx, b.pool, `select count(distinct event_id) from usage_events where org like $1`, like))
	require.EqualValues(t, outcomes, count(t, b.ctx, b.pool, ownOutcomes, like))

	// The metrics are registered under their names.
	families, err := again.reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	for _, want := range []string{"metergate_meter_messages_total", "metergate_meter_rows_inserted_total", "metergate_meter_duplicates_total",
		"metergate_meter_dead_letters_total", "metergate_meter_batch_seconds", "metergate_meter_lag"} {
		require.Contains(t, names, want)
	}
	require.NoError(t, first.stop())
	require.NoError(t, again.stop())
}

// Malformed messages go to dead_letters with their raw bytes and the reason, and the
// events after them still land.
func TestMalformedMessagesAreDeadLettersAndThePipelineMovesOn(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var msgs []kafka.Message
	for _, tc := range malformed {
		msgs = append(msgs, kafka.Message{Key: []byte(tc.name), Value: tc.value(t)})
	}
	msgs = append(msgs, kafka.Message{Key: []byte("tombstone")}) // no value at all
	org := b.name + "-org"
	after := b.name + "-after"
	msgs = append(msgs, message(t, org, admittedEvent(t, after, time.Now(), orgPath(org), map[string]int64{"tokens": 9})))
	b.produce(t, msgs...)

	m := start(t, b.pool, b.options("g"))
	waitFor(t, b.ctx, "the event after the malformed ones", func() bool {
		return count(t, b.ctx, b.pool, `select count(*) from usage_events where event_id = $1`, after) == 1
	})
	rows, err := b.pool.Query(b.ctx, `select "partition", "offset", key, value, error from dead_letters where topic = $1 order by "offset"`, b.topic)
	require.NoError(t, err)
	type dead struct {
		partition  int
		offset     int64
		key, value []byte
		err        string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dead, error) {
		var d dead
		return d, r.Scan(&d.partition, &d.offset, &d.key, &d.value, &d.err)
	})
	require.NoError(t, err)
	require.Len(t, got, len(malformed)+1)
	for i, tc := range malformed {
		require.EqualValues(t, i, got[i].offset, tc.name)
		require.Equal(t, tc.name, string(got[i].key))
		require.Equal(t, tc.value(t), got[i].value, tc.name)
		require.Contains(t, got[i].err, tc.err, tc.name)
	}
	tomb := got[len(malformed)]
	require.Equal(t, "tombstone", string(tomb.key))
	require.Empty(t, tomb.value)
	require.Contains(t, tomb.err, "not a CloudEvent in JSON")
	waitFor(t, b.ctx, "the metrics", func() bool { return m.messages() == int64(len(msgs)) })
	require.EqualValues(t, len(malformed)+1, testutil.ToFloat64(m.metrics.deadLetters))
	require.EqualValues(t, len(malformed)+1, m.inserted("dead_letters"))
}

// An event of a month long gone lands in a partition made for it on the spot; the
// partitions of this month and the next two exist ahead of time.
func TestPartitionsAheadAndOnDemand(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	// 14 months back: a month no other test of the package writes.
	old := time.Now().UTC().AddDate(-1, -2, 0)
	oldPartition := "usage_events_" + old.Format("2006_01")
	exists := func(name string) bool {
		var ok bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `select to_regclass($1) is not null`, name).Scan(&ok))
		return ok
	}
	require.False(t, exists(oldPartition))
	org := b.name + "-org"
	id := b.name + "-old"
	b.produce(t, message(t, org, admittedEvent(t, id, old, orgPath(org), map[string]int64{"tokens": 1})))

	start(t, b.pool, b.options("g"))
	waitFor(t, b.ctx, "the old event", func() bool {
		return count(t, b.ctx, b.pool, `select count(*) from usage_events where event_id = $1`, id) == 1
	})
	var table string
	require.NoError(t, b.pool.QueryRow(b.ctx, `select tableoid::regclass::text from usage_events where event_id = $1`, id).Scan(&table))
	require.Equal(t, oldPartition, table)
	for _, m := range aheadMonths(time.Now()) {
		name := "usage_events_" + m.Format("2006_01")
		waitFor(t, b.ctx, name, func() bool { return exists(name) })
	}
}

// usage_of is the exact usage of an account at any level of its tree, over [from, to).
func TestUsageOf(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	org := b.name + "-org"
	node := func(account, kind string) event.PathNode { return event.PathNode{Account: account, Kind: kind} }
	o, teamA, teamB := node(org, "org"), node(org+"-a", "team"), node(org+"-b", "team")
	agentA1, agentA2, agentB1 := node(org+"-a1", "agent"), node(org+"-a2", "agent"), node(org+"-b1", "agent")
	paths := [][]event.PathNode{{o}, {o, teamA}, {o, teamA, agentA1}, {o, teamA, agentA2}, {o, teamB, agentB1}}

	from := time.Date(2026, 3, 31, 23, 0, 0, 0, time.UTC) // the window spans a month boundary
	to := from.Add(2 * time.Hour)
	type total struct{ events, requests, tokens, credits, cost int64 }
	want := map[string]*total{}
	var msgs []kafka.Message
	for i := range 200 {
		path := paths[i%len(paths)]
		// From an hour before the window to an hour after it, both ends included.
		at := from.Add(-time.Hour + time.Duration(i)*4*time.Hour/199)
		switch i {
		case 0:
			at = from // included
		case 1:
			at = to // excluded
		case 2:
			at = to.Add(-time.Microsecond) // included
		}
		u := map[string]int64{"requests": 1, "tokens": int64(100 + i), "credits": int64(i % 7), "cost_micros": int64(1000 * i)}
		msgs = append(msgs, message(t, org, admittedEvent(t, fmt.Sprintf("%s-e%d", b.name, i), at, path, u)))
		if at.Before(from) || !at.Before(to) {
			continue
		}
		for _, n := range path {
			if want[n.Account] == nil {
				want[n.Account] = &total{}
			}
			w := want[n.Account]
			w.events++
			w.requests += u["requests"]
			w.tokens += u["tokens"]
			w.credits += u["credits"]
			w.cost += u["cost_micros"]
		}
	}
	b.produce(t, msgs...)
	start(t, b.pool, b.options("g"))
	waitFor(t, b.ctx, "every event", func() bool {
		return count(t, b.ctx, b.pool, `select count(*) from usage_events where org = $1`, org) == int64(len(msgs))
	})

	usageOf := func(account string, from, to time.Time) total {
		var got total
		require.NoError(t, b.pool.QueryRow(b.ctx, `select * from usage_of($1, $2, $3)`, account, from, to).Scan(
			&got.events, &got.requests, &got.tokens, &got.credits, &got.cost))
		return got
	}
	for _, account := range []string{org, teamA.Account, teamB.Account, agentA1.Account, agentB1.Account} {
		require.NotZero(t, want[account].events, account)
		require.Equal(t, *want[account], usageOf(account, from, to), account)
	}
	require.Greater(t, want[org].events, want[teamA.Account].events+want[teamB.Account].events, "the org counts its own events too")
	require.Equal(t, int64(1), usageOf(org, to, to.Add(time.Microsecond)).events, "the event at to belongs to the next window")
	require.Equal(t, total{}, usageOf(org, to.Add(time.Microsecond), to.Add(2*time.Microsecond)))
	require.Equal(t, total{}, usageOf(b.name+"-nobody", from, to))
}

// While PostgreSQL cannot be reached the meter commits no offsets (and counts nothing as
// consumed); a meter of the same group started afterwards gets every event.
func TestPostgresDownCommitsNothing(t *testing.T) {
	t.Parallel()
	const partitions, n = 3, 300
	b := setup(t, partitions)
	dead, err := pgxpool.New(b.ctx, "postgres://metergate:metergate@"+testenv.FreeAddr(t)+"/metergate?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(dead.Close)

	var msgs []kafka.Message
	for i := range n {
		org := fmt.Sprintf("%s-o%d", b.name, i%6)
		msgs = append(msgs, message(t, org, admittedEvent(t, fmt.Sprintf("%s-e%d", b.name, i), time.Now(), orgPath(org), map[string]int64{"requests": 1})))
	}
	b.produce(t, msgs...)

	opts := b.options("g")
	opts.RetryMin, opts.RetryMax, opts.FlushTimeout = 10*time.Millisecond, 50*time.Millisecond, 500*time.Millisecond
	opts.BatchSize = 50
	down := start(t, dead, opts)
	waitFor(t, b.ctx, "write retries", func() bool { return testutil.ToFloat64(down.metrics.retries) >= 5 })
	require.Zero(t, down.messages(), "nothing counted as consumed")
	// A batch for each writer, and one more fetched that waits for a writer.
	inHand := int64((down.opts.Writers + 1) * opts.BatchSize)
	waitFor(t, b.ctx, "the batches in hand", func() bool { return down.fetched.Load() == inHand })
	time.Sleep(100 * time.Millisecond) // to see that nothing more is fetched
	require.Equal(t, inHand, down.fetched.Load(), "the batches in hand, nothing fetched beyond them")
	err = down.stop()
	require.ErrorContains(t, err, "offsets not committed")

	client := &kafka.Client{Addr: kafka.TCP(b.brokers...), Timeout: 10 * time.Second}
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	resp, err := client.OffsetFetch(b.ctx, &kafka.OffsetFetchRequest{GroupID: opts.Group, Topics: map[string][]int{b.topic: parts}})
	require.NoError(t, err)
	require.NoError(t, resp.Error)
	require.Len(t, resp.Topics[b.topic], partitions)
	for _, p := range resp.Topics[b.topic] {
		require.NoError(t, p.Error)
		require.EqualValues(t, -1, p.CommittedOffset, "partition %d has a committed offset", p.Partition)
	}

	up := start(t, b.pool, opts)
	waitFor(t, b.ctx, "every event through the same group", func() bool {
		return count(t, b.ctx, b.pool, `select count(*) from usage_events where org like $1`, b.name+"-%") == n
	})
	waitFor(t, b.ctx, "the metrics", func() bool { return up.messages() == n })
	require.NoError(t, up.stop())
}

// A shutdown writes the batch in hand and commits its offsets before Run returns.
func TestShutdownFlushesTheBatchInHand(t *testing.T) {
	t.Parallel()
	const n = 50
	b := setup(t, 2)
	var msgs []kafka.Message
	for i := range n {
		org := fmt.Sprintf("%s-o%d", b.name, i%4)
		msgs = append(msgs, message(t, org, admittedEvent(t, fmt.Sprintf("%s-e%d", b.name, i), time.Now(), orgPath(org), map[string]int64{"requests": 1})))
	}
	b.produce(t, msgs...)
	opts := b.options("g")
	opts.BatchWait = time.Hour // the batch never fills by itself
	m := start(t, b.pool, opts)
	waitFor(t, b.ctx, "the batch in hand", func() bool { return m.fetched.Load() == n })
	own := `select count(*) from usage_events where org like $1`
	require.Zero(t, count(t, b.ctx, b.pool, own, b.name+"-%"), "nothing written before the shutdown")
	require.NoError(t, m.stop())
	require.EqualValues(t, n, count(t, b.ctx, b.pool, own, b.name+"-%"))

	client := &kafka.Client{Addr: kafka.TCP(b.brokers...), Timeout: 10 * time.Second}
	resp, err := client.OffsetFetch(b.ctx, &kafka.OffsetFetchRequest{GroupID: opts.Group, Topics: map[string][]int{b.topic: {0, 1}}})
	require.NoError(t, err)
	var committed int64
	for _, p := range resp.Topics[b.topic] {
		committed += max(p.CommittedOffset, 0)
	}
	require.EqualValues(t, n, committed, "the offsets of every message are committed")
}

// A row that passes the meter's checks but that PostgreSQL refuses (here: a constraint
// added by hand) goes to dead_letters; its batch's other rows are written.
func TestRowRefusedByPostgresIsADeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	pool, _ := testenv.EmptySchema(t)
	_, err := migrations.Up(b.ctx, pool)
	require.NoError(t, err)
	_, err = pool.Exec(b.ctx, `alter table usage_events add constraint no_forbidden_tool check (tool is distinct from 'forbidden')`)
	require.NoError(t, err)

	org := b.name + "-org"
	var msgs []kafka.Message
	for i := range 5 {
		ev := admittedEvent(t, fmt.Sprintf("%s-e%d", b.name, i), time.Now(), orgPath(org), map[string]int64{"requests": 1})
		if i == 2 {
			var d event.Admitted
			require.NoError(t, json.Unmarshal(ev.Data, &d))
			d.Tool = "forbidden"
			ev.Data, err = json.Marshal(d)
			require.NoError(t, err)
		}
		msgs = append(msgs, message(t, org, ev))
	}
	b.produce(t, msgs...)
	m := start(t, pool, b.options("g"))
	waitFor(t, b.ctx, "the batch", func() bool { return m.messages() == 5 })
	require.EqualValues(t, 4, count(t, b.ctx, pool, `select count(*) from usage_events`))
	var offset int64
	var reason string
	require.NoError(t, pool.QueryRow(b.ctx, `select "offset", error from dead_letters where topic = $1`, b.topic).Scan(&offset, &reason))
	require.EqualValues(t, 2, offset)
	require.Contains(t, reason, "refused by PostgreSQL")
	require.Contains(t, reason, "no_forbidden_tool")
	require.EqualValues(t, 1, testutil.ToFloat64(m.metrics.refused))
}

// Migration 3 rolls back with partitions in place, and applies again.
func TestUsageLogMigrationDownWithPartitions(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, time.Minute)
	pool, schema := testenv.EmptySchema(t)
	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	s := newStore(pool, "t")
	require.NoError(t, s.ensurePartitions(ctx, append(aheadMonths(time.Now()), time.Date(2020, 2, 1, 0, 0, 0, 0, time.UTC))))
	tables := func() int64 {
		return count(t, ctx, pool, `select count(*) from pg_tables where schemaname = $1 and tablename like 'usage%'`, schema)
	}
	require.EqualValues(t, 8+4, tables(), "usage_events, usage_outcomes, usage_voids, usage_borrowings, usage_alerts, "+
		"usage_daily_totals, usage_daily_changes, usage_daily_queue and four partitions")

	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 2)
	require.NoError(t, err)
	require.Zero(t, tables())
	require.Zero(t, count(t, ctx, pool, `select count(*) from pg_proc p join pg_namespace n on n.oid = p.pronamespace
		where n.nspname = $1 and p.proname in ('usage_of', 'usage_events_partition')`, schema))
	_, err = migrations.Up(ctx, pool)
	require.NoError(t, err)
	require.EqualValues(t, 8, tables())
}

// An unreachable Kafka makes the meter retry, not stop.
func TestKafkaUnreachableIsRetried(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	name := strings.ReplaceAll(testenv.Name(t), "_", "-")
	m := start(t, testenv.Postgres(t), Options{Brokers: []string{testenv.FreeAddr(t)}, Topic: "t." + name, Group: name,
		RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond})
	waitFor(t, ctx, "fetch errors", func() bool { return testutil.ToFloat64(m.metrics.fetchErrs) >= 2 })
	require.NoError(t, m.stop(), "still running, and stops cleanly")
}

// An event of a closed (invoiced) period is recorded and flagged late, for the next
// invoice to bill; an event of an open period is not.
func TestEventsOfAClosedPeriodAreLate(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	// Months no other test of the package writes or closes.
	closed := period.MonthStart(time.Now().AddDate(-2, -8, 0))
	open := closed.AddDate(0, -1, 0)
	_, err := b.pool.Exec(b.ctx, `insert into periods (period, closed_at, closed_by) values ($1, now(), 'test')`, closed)
	require.NoError(t, err)
	org := b.name + "-org"
	lateID, onTimeID := b.name+"-late", b.name+"-on-time"
	b.produce(t,
		message(t, org, admittedEvent(t, lateID, closed.Add(36*time.Hour), orgPath(org), map[string]int64{"tokens": 5})),
		message(t, org, admittedEvent(t, onTimeID, open.Add(36*time.Hour), orgPath(org), map[string]int64{"tokens": 7})))

	start(t, b.pool, b.options("g"))
	waitFor(t, b.ctx, "both events", func() bool {
		return count(t, b.ctx, b.pool, `select count(*) from usage_events where event_id = any($1)`, []string{lateID, onTimeID}) == 2
	})
	var late, onTime bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `select late from usage_events where event_id = $1`, lateID).Scan(&late))
	require.NoError(t, b.pool.QueryRow(b.ctx, `select late from usage_events where event_id = $1`, onTimeID).Scan(&onTime))
	require.True(t, late, "an event of a closed period is late")
	require.False(t, onTime, "an event of an open period is not")
}

// A failpoint's error stops the meter where it is, as a crash there would: a batch written
// after its rows but before its offsets is consumed again by the next meter of the group,
// and each event is still one row.
func TestFailpointErrorStopsLikeACrash(t *testing.T) {
	t.Parallel()
	const n = 120
	b := setup(t, 2)
	var msgs []kafka.Message
	for i := range n {
		org := fmt.Sprintf("%s-o%d", b.name, i%4)
		msgs = append(msgs, message(t, org, admittedEvent(t, fmt.Sprintf("%s-e%d", b.name, i), time.Now(), orgPath(org), map[string]int64{"requests": 1})))
	}
	b.produce(t, msgs...)

	errCrash := errors.New("crash")
	crashed := make(chan struct{})
	var once sync.Once
	opts := b.options("g")
	opts.Failpoint = func(point string) error {
		if point != AfterWrite {
			return nil
		}
		once.Do(func() { close(crashed) })
		return errCrash
	}
	first := start(t, b.pool, opts)
	select {
	case <-crashed:
	case <-b.ctx.Done():
		t.Fatal("the failpoint was never reached")
	}
	require.ErrorIs(t, first.stop(), errCrash)
	written := count(t, b.ctx, b.pool, `select count(*) from usage_events where org like $1`, b.name+"-%")
	require.Positive(t, written, "the batch's rows were written before the failpoint")

	opts.Failpoint = nil
	again := start(t, b.pool, opts)
	waitFor(t, b.ctx, "every event through the same group", func() bool {
		return count(t, b.ctx, b.pool, `select count(*) from usage_events where org like $1`, b.name+"-%") == n
	})
	waitFor(t, b.ctx, "the metrics", func() bool { return again.messages() >= n })
	require.Positive(t, again.duplicates("usage_events"), "the uncommitted batch came again")
	require.NoError(t, again.stop())
}
