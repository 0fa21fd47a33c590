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

	"github.com/metergate/metergate/pkg/testenv"
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

// BenchmarkIngest is the sustained rate from Kafka into usage_events at the default batch
// settings (1000 messages, 200 ms), one op = one event, against a baseline measured in the
// same run: PostgreSQL alone generating the same rows server-side (INSERT … SELECT
// generate_series … ON CONFLICT DO NOTHING into the same table).
//
//	go test -run '^$' -bench Ingest -benchtime 20000x ./pkg/meter/
func BenchmarkIngest(b *testing.B) {
	b.Run("baseline_insert_select", func(b *testing.B) {
		tb := benchBundle(b)
		s := newStore(tb.pool, tb.topic)
		require.NoError(b, s.ensurePartitions(tb.ctx, aheadMonths(time.Now())))
		b.ReportAllocs()
		b.ResetTimer()
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
ON CONFLICT (event_id, billing_period) DO NOTHING`, tb.name, b.N)
		require.NoError(b, err)
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	})

	b.Run("meter", func(b *testing.B) {
		tb := benchBundle(b)
		tb.produce(b, benchMessages(b, tb.name, b.N)...)
		reg := prometheus.NewRegistry()
		m, err := New(tb.pool, Options{Brokers: tb.brokers, Topic: tb.topic, Group: tb.name, Registerer: reg})
		require.NoError(b, err)
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		inserted := func() int { return int(testutil.ToFloat64(m.metrics.rows.WithLabelValues("usage_events"))) }
		var first time.Time
		firstRows := 0
		for inserted() < b.N {
			if first.IsZero() && inserted() > 0 {
				first, firstRows = time.Now(), inserted()
			}
			select {
			case <-tb.ctx.Done():
				b.Fatalf("timed out: %d of %d rows", inserted(), b.N)
			case <-time.After(time.Millisecond):
			}
		}
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		require.NoError(b, <-done)
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		if steady := time.Since(first) - (time.Since(start) - elapsed); b.N > firstRows && !first.IsZero() && steady > 0 {
			// From the first batch written on: the group join and first fetch left out.
			b.ReportMetric(float64(b.N-firstRows)/steady.Seconds(), "steady-events/s")
		}
	})
}

// BenchmarkProduceToRow is the time from producing a batch of events (one WriteMessages
// call, acknowledged by every replica) to its last row being committed in usage_events, by
// a meter that is running and caught up. One op = one batch.
//
//	go test -run '^$' -bench ProduceToRow -benchtime 20x ./pkg/meter/
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
