package meter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// benchBundle is setup for a benchmark: the package's schema, a topic of 12 partitions (the
// default of KAFKA_TOPIC_PARTITIONS) and a producer.
func benchBundle(b *testing.B) *testBundle {
	b.Helper()
	tb := &testBundle{
		ctx:     testenv.Context(b, 10*time.Minute),
		pool:    testenv.Postgres(b),
		brokers: testenv.KafkaBrokers(b),
		topic:   testenv.Topic(b, 12),
		name:    fmt.Sprintf("bench-%s", testenv.Random(4)),
	}
	tb.writer = &kafka.Writer{Addr: kafka.TCP(tb.brokers...), Topic: tb.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: time.Millisecond, BatchBytes: 64 << 20}
	b.Cleanup(func() { _ = tb.writer.Close() })
	return tb
}

// benchMessages are n admissions of 100 orgs (spread over the partitions), 3-level paths.
func benchMessages(b *testing.B, prefix string, n int) []kafka.Message {
	b.Helper()
	now := time.Now().UTC()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		org := fmt.Sprintf("%s-o%d", prefix, i%100)
		msgs[i] = message(b, org, admittedEvent(b, fmt.Sprintf("%s-e%d", prefix, i), now, orgPath(org),
			map[string]int64{"requests": 1, "tokens": int64(i % 5000), "credits": 3}))
	}
	return msgs
}

// BenchmarkMeterVsInsertSelect is the sustained rate from Kafka into usage_events at the
// default settings against a baseline measured in the same run: PostgreSQL alone generating
// the same rows server-side (INSERT … SELECT generate_series … ON CONFLICT DO NOTHING into
// the same table), half of b.N rows before the meter runs and half after, so that a change
// of load on a shared machine weighs on both. One op = one event. The meter drains b.N
// events produced before the timer starts; its rate is taken from its first row written on,
// so that joining the group and the first fetch are left out (meter-total-events/s counts
// them). make bench's meter_vs_insert_select is meter-total-events/s ÷ baseline-events/s,
// the median of -rounds runs (bench/gobench.go).
//
//	go test -run '^$' -bench MeterVsInsertSelect -benchtime 50000x ./internal/meter/
func BenchmarkMeterVsInsertSelect(b *testing.B) {
	tb := benchBundle(b)
	s := newStore(tb.pool, tb.topic)
	require.NoError(b, s.ensurePartitions(tb.ctx, aheadMonths(time.Now())))
	tb.produce(b, benchMessages(b, tb.name, b.N)...)
	m, err := New(tb.pool, Options{Brokers: tb.brokers, Topic: tb.topic, Group: tb.name, Registerer: prometheus.NewRegistry()})
	require.NoError(b, err)
	insertSelect := func(prefix string, n int) time.Duration {
		start := time.Now()
		_, err := tb.pool.Exec(tb.ctx, `
INSERT INTO usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path,
    plan, source, requests, tokens, credits, kafka_partition, kafka_offset)
SELECT $1 || '-e' || i, date_trunc('month', now() AT TIME ZONE 'UTC')::date, now(), date_trunc('month', now() AT TIME ZONE 'UTC')::date,
    $1 || '-o' || (i % 100), $1 || '-o' || (i % 100) || '-agent', 'agent',
    ARRAY[$1 || '-o' || (i % 100), $1 || '-o' || (i % 100) || '-team', $1 || '-o' || (i % 100) || '-agent'],
    'pro', 'node-1', 1, i % 5000, 3, i % 12, i
FROM generate_series(1, $2::int) i
ORDER BY 1
ON CONFLICT (event_id, billing_period) DO NOTHING`, prefix, n)
		require.NoError(b, err)
		return time.Since(start)
	}
	b.ReportAllocs()
	b.ResetTimer()

	baseline := insertSelect(tb.name+"-before", b.N/2)

	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	inserted := func() int { return int(testutil.ToFloat64(m.metrics.rows.WithLabelValues("usage_events"))) }
	var first time.Time
	firstRows := 0
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for n := inserted(); n < b.N; n = inserted() {
		if first.IsZero() && n > 0 {
			first, firstRows = time.Now(), n
		}
		select {
		case <-tb.ctx.Done():
			b.Fatalf("timed out: %d of %d rows", n, b.N)
		case <-tick.C:
		}
	}
	end := time.Now()
	cancel()
	require.NoError(b, <-done)

	baseline += insertSelect(tb.name+"-after", b.N-b.N/2)
	b.StopTimer()

	baselineRate := float64(b.N) / baseline.Seconds()
	b.ReportMetric(baselineRate, "baseline-events/s")
	b.ReportMetric(float64(b.N)/end.Sub(start).Seconds(), "meter-total-events/s")
	if first.IsZero() || firstRows == b.N { // one batch: no rate after the first one
		first, firstRows = start, 0
	}
	meter := float64(b.N-firstRows) / end.Sub(first).Seconds()
	b.ReportMetric(meter, "meter-events/s")
	b.ReportMetric(meter/baselineRate, "meter_vs_insert_select")
}

// BenchmarkProduceToRow is the time from producing a batch of events (one WriteMessages
// call, acknowledged by every replica) to its last row being committed in usage_events, by
// a meter that is running and caught up. One op = one batch.
//
//	go test -run '^$' -bench ProduceToRow -benchtime 20x ./internal/meter/
func BenchmarkProduceToRow(b *testing.B) {
	for _, size := range []int{1, 1000} {
		b.Run(fmt.Sprintf("events=%d", size), func(b *testing.B) {
			tb := benchBundle(b)
			m, err := New(tb.pool, Options{Brokers: tb.brokers, Topic: tb.topic, Group: tb.name, Registerer: prometheus.NewRegistry()})
			require.NoError(b, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- m.Run(ctx) }()
			inserted := func() int { return int(testutil.ToFloat64(m.metrics.rows.WithLabelValues("usage_events"))) }
			wait := func(n int) {
				for inserted() < n {
					select {
					case <-tb.ctx.Done():
						b.Fatalf("timed out: %d of %d rows", inserted(), n)
					case <-time.After(200 * time.Microsecond):
					}
				}
			}
			// Warm up: the group joined and one batch written.
			tb.produce(b, benchMessages(b, tb.name+"-warm", 1)...)
			wait(1)
			var worst time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				msgs := benchMessages(b, fmt.Sprintf("%s-%d", tb.name, i), size)
				want := inserted() + size
				b.StartTimer()
				start := time.Now()
				require.NoError(b, tb.writer.WriteMessages(tb.ctx, msgs...))
				wait(want)
				worst = max(worst, time.Since(start))
			}
			b.StopTimer()
			b.ReportMetric(float64(worst.Milliseconds()), "max-ms")
			cancel()
			require.NoError(b, <-done)
		})
	}
}
