package billinglog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/meter"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
	"github.com/metergate/metergate/pkg/event"
)

// indexSchemas returns two schemas with every migration applied, the second without the
// index of migration 00021, each with the current month's partition.
func indexSchemas(b *testing.B, ctx context.Context) (with, without *pgxpool.Pool) {
	b.Helper()
	schema := func(index bool) *pgxpool.Pool {
		pool, _ := testenv.EmptySchema(b)
		_, err := migrations.Up(ctx, pool)
		require.NoError(b, err)
		if !index {
			_, err = pool.Exec(ctx, `DROP INDEX usage_events_idempotency_idx`)
			require.NoError(b, err)
		}
		_, err = pool.Exec(ctx, `SELECT usage_events_partition(now()::date)`)
		require.NoError(b, err)
		return pool
	}
	return schema(true), schema(false)
}

// median is the middle of xs (sorted in place).
func median(xs []float64) float64 {
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// BenchmarkIdempotencyIndexInsert is what the index of migration 00021 costs the billing
// log's writes when every request carries an idempotency key (the index's worst case: rows
// without a key cost it only the predicate): INSERT … SELECT of keyed rows into usage_events
// with the index, against the same into a schema without it, in interleaved rounds on the
// same server. One op = one row of each. indexed_vs_unindexed is the median of the rounds'
// ratios of rows/s (1.0: free).
//
//	go test -run '^$' -bench IdempotencyIndexInsert -benchtime 200000x ./internal/billinglog/
func BenchmarkIdempotencyIndexInsert(b *testing.B) {
	ctx := testenv.Context(b, 10*time.Minute)
	with, without := indexSchemas(b, ctx)
	insert := func(pool *pgxpool.Pool, round, n int) time.Duration {
		start := time.Now()
		_, err := pool.Exec(ctx, `
INSERT INTO usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path,
    idempotency_key, plan, tool, source, requests, tokens, credits, kafka_partition, kafka_offset)
SELECT $1 || '-e' || i, date_trunc('month', now() AT TIME ZONE 'UTC')::date, now(), date_trunc('month', now() AT TIME ZONE 'UTC')::date,
    'o' || (i % 100), 'o' || (i % 100) || '-agent', 'agent', ARRAY['o' || (i % 100), 'o' || (i % 100) || '-agent'],
    md5($1 || i), 'pro', 'llm_call', 'node-1', 1, i % 5000, 3, i % 12, i
FROM generate_series(1, $2::int) i
ON CONFLICT (event_id, billing_period) DO NOTHING`, "r"+string(rune('a'+round)), n)
		require.NoError(b, err)
		return time.Since(start)
	}
	const rounds = 6
	per := max(1, b.N/rounds)
	b.ReportAllocs()
	b.ResetTimer()
	var tWith, tWithout time.Duration
	ratios := make([]float64, 0, rounds)
	for r := range rounds {
		var dw, dn time.Duration
		if r%2 == 0 { // alternate which goes first
			dw, dn = insert(with, r, per), insert(without, r, per)
		} else {
			dn, dw = insert(without, r, per), insert(with, r, per)
		}
		tWith, tWithout = tWith+dw, tWithout+dn
		ratios = append(ratios, dn.Seconds()/dw.Seconds())
	}
	b.StopTimer()
	rows := float64(per * rounds)
	b.ReportMetric(rows/tWith.Seconds(), "indexed-rows/s")
	b.ReportMetric(rows/tWithout.Seconds(), "unindexed-rows/s")
	b.ReportMetric(median(ratios), "indexed_vs_unindexed")
}

// BenchmarkMeterKeyedIndex is the same comparison through the meter: b.N/rounds usage
// events, each with an idempotency key of its own, produced to a topic and written by a
// meter (internal/meter, default settings) into a schema with the index and into one without,
// in interleaved rounds. A round's rate is taken from its first row to its last, as
// BenchmarkMeterVsInsertSelect does (joining the group left out). indexed_vs_unindexed is
// the median of the rounds' ratios of events/s.
//
//	go test -run '^$' -bench MeterKeyedIndex -benchtime 120000x ./internal/billinglog/
func BenchmarkMeterKeyedIndex(b *testing.B) {
	const rounds = 6
	per := b.N / rounds
	if per < 1000 {
		return // the run of b.N = 1 before the measured one: too few events for a rate
	}
	ctx := testenv.Context(b, 20*time.Minute)
	with, without := indexSchemas(b, ctx)
	brokers := testenv.KafkaBrokers(b)
	now := time.Now().UTC()
	run := func(pool *pgxpool.Pool, round int) float64 {
		topic := testenv.Topic(b, 4)
		msgs := make([]kafka.Message, per)
		for i := range msgs {
			org := fmt.Sprintf("o%d", i%100)
			path := []event.PathNode{{Account: org, Kind: "org"}, {Account: org + "-agent", Kind: "agent"}}
			ev, err := event.New(fmt.Sprintf("%s-r%d-e%d", topic, round, i), "node-1", event.TypeAdmitted, event.Subject(path), now, event.Admitted{
				Org: org, Account: org + "-agent", Path: path, IdempotencyKey: fmt.Sprintf("%x", i*2654435761+round),
				Units: map[string]int64{"requests": 1, "tokens": int64(i % 5000), "credits": 3}, Period: period.MonthLabel(now), Plan: "pro", Tool: "llm_call",
			})
			require.NoError(b, err)
			v, err := json.Marshal(ev)
			require.NoError(b, err)
			msgs[i] = kafka.Message{Key: []byte(org), Value: v}
		}
		w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: time.Millisecond}
		require.NoError(b, w.WriteMessages(ctx, msgs...))
		require.NoError(b, w.Close())
		var before int
		require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM usage_events`).Scan(&before))
		m, err := meter.New(pool, meter.Options{Brokers: brokers, Topic: topic, Group: "g-" + topic})
		require.NoError(b, err)
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.Run(mctx) }()
		var first time.Time
		firstRows := 0
		for {
			var n int
			require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM usage_events`).Scan(&n))
			n -= before
			if first.IsZero() && n > 0 {
				first, firstRows = time.Now(), n
			}
			if n >= per {
				break
			}
			require.NoError(b, ctx.Err(), "%d of %d rows", n, per)
			time.Sleep(2 * time.Millisecond)
		}
		end := time.Now()
		cancel()
		require.NoError(b, <-done)
		if firstRows >= per {
			return 0 // one batch: no rate after the first
		}
		return float64(per-firstRows) / end.Sub(first).Seconds()
	}
	b.ResetTimer()
	var rw, rn, ratios []float64
	for r := range rounds {
		var w, n float64
		if r%2 == 0 {
			w, n = run(with, r), run(without, r)
		} else {
			n, w = run(without, r), run(with, r)
		}
		if w > 0 && n > 0 {
			rw, rn, ratios = append(rw, w), append(rn, n), append(ratios, w/n)
		}
	}
	b.StopTimer()
	require.NotEmpty(b, ratios, "rounds too small for a rate: raise -benchtime")
	b.ReportMetric(median(rw), "indexed-events/s")
	b.ReportMetric(median(rn), "unindexed-events/s")
	b.ReportMetric(median(ratios), "indexed_vs_unindexed")
}
