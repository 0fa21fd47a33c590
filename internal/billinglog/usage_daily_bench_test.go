package billinglog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/meter"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
	"github.com/metergate/metergate/pkg/event"
)

// usageDailyTriggers are the triggers of migration 00028, by table.
var usageDailyTriggers = map[string][]string{
	"usage_events":   {"usage_daily_insert", "usage_daily_update", "usage_daily_delete", "usage_daily_truncate"},
	"usage_outcomes": {"usage_daily_insert", "usage_daily_update", "usage_daily_delete", "usage_daily_truncate"},
	"usage_voids":    {"usage_daily_insert", "usage_daily_update", "usage_daily_delete", "usage_daily_truncate"},
}

// rollupSchemas returns two schemas with every migration applied, the second without the
// triggers of usage_daily, each with the partitions of a year of the log (an outcome's
// admission is looked up in each) and of the next two months.
func rollupSchemas(b *testing.B, ctx context.Context) (with, without *pgxpool.Pool) {
	b.Helper()
	schema := func(triggers bool) *pgxpool.Pool {
		pool, _ := testenv.EmptySchema(b)
		_, err := migrations.Up(ctx, pool)
		require.NoError(b, err)
		if !triggers {
			for table, names := range usageDailyTriggers {
				for _, name := range names {
					_, err = pool.Exec(ctx, fmt.Sprintf(`DROP TRIGGER %s ON %s`, name, table))
					require.NoError(b, err)
				}
			}
		}
		for m := -12; m <= 2; m++ {
			_, err = pool.Exec(ctx, `SELECT usage_events_partition((now() + make_interval(months => $1))::date)`, m)
			require.NoError(b, err)
		}
		return pool
	}
	return schema(true), schema(false)
}

// rowsInserted is the meter's metergate_meter_rows_inserted_total, every table summed.
func rowsInserted(b *testing.B, reg *prometheus.Registry) int {
	b.Helper()
	mfs, err := reg.Gather()
	require.NoError(b, err)
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "metergate_meter_rows_inserted_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int(n)
}

// BenchmarkMeterUsageDaily is what the triggers of usage_daily (migration 00028) cost the
// meter: b.N/rounds admissions of 100 orgs with 3-level paths, each followed on its Kafka
// partition by its outcome (one in ten a 503, the others 200 with actual tokens) and one
// in a hundred by a void, produced to a topic and written by a meter (internal/meter,
// default settings: batches of 1,000, 3 writers) into a schema with the triggers and into
// one without, in interleaved rounds. A round's rate is of messages from the meter's first
// row to its last (joining the group left out), as BenchmarkMeterKeyedIndex takes it.
// with_vs_without is the median of the rounds' ratios of messages/s (1.0: free).
//
//	go test -run '^$' -bench MeterUsageDaily -benchtime 120000x ./internal/billinglog/
func BenchmarkMeterUsageDaily(b *testing.B) {
	const rounds = 6
	per := b.N / rounds // admissions of a round
	if per < 1000 {
		return // the run of b.N = 1 before the measured one: too few events for a rate
	}
	ctx := testenv.Context(b, 30*time.Minute)
	with, without := rollupSchemas(b, ctx)
	brokers := testenv.KafkaBrokers(b)
	now := time.Now().UTC()
	run := func(pool *pgxpool.Pool, round int) float64 {
		topic := testenv.Topic(b, 4)
		var msgs []kafka.Message
		add := func(org string, ev event.CloudEvent) {
			v, err := json.Marshal(ev)
			require.NoError(b, err)
			msgs = append(msgs, kafka.Message{Key: []byte(org), Value: v})
		}
		for i := range per {
			org := fmt.Sprintf("o%d", i%100)
			path := []event.PathNode{{Account: org, Kind: "org"}, {Account: fmt.Sprintf("%s-t%d", org, i%3), Kind: "team"},
				{Account: fmt.Sprintf("%s-t%d-a%d", org, i%3, i%7), Kind: "agent"}}
			id := fmt.Sprintf("%s-r%d-e%d", topic, round, i)
			ev, err := event.New(id, "node-1", event.TypeAdmitted, event.Subject(path), now, event.Admitted{
				Org: org, Account: path[2].Account, Path: path, Period: period.MonthLabel(now), Plan: "pro",
				Units: map[string]int64{"requests": 1, "tokens": int64(i % 5000), "credits": 3},
			})
			require.NoError(b, err)
			add(org, ev)
			status, units := 200, map[string]int64{"tokens": int64(i % 4000)}
			if i%10 == 0 {
				status, units = 503, nil
			}
			ev, err = event.New(id+"/outcome", "node-2", event.TypeOutcome, "", now, event.Outcome{EventID: id, Status: status, Units: units})
			require.NoError(b, err)
			add(org, ev)
			if i%100 == 1 {
				ev, err = event.New(id+event.VoidSuffix, "node-1", event.TypeVoided, "", now, event.Voided{EventID: id, Attempt: id, Reason: event.VoidCallerGone})
				require.NoError(b, err)
				add(org, ev)
			}
		}
		w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
			BatchSize: 1000, BatchTimeout: time.Millisecond, BatchBytes: 64 << 20}
		require.NoError(b, w.WriteMessages(ctx, msgs...))
		require.NoError(b, w.Close())
		reg := prometheus.NewRegistry()
		m, err := meter.New(pool, meter.Options{Brokers: brokers, Topic: topic, Group: "g-" + topic, Registerer: reg})
		require.NoError(b, err)
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.Run(mctx) }()
		var first time.Time
		firstRows := 0
		for n := rowsInserted(b, reg); n < len(msgs); n = rowsInserted(b, reg) {
			if first.IsZero() && n > 0 {
				first, firstRows = time.Now(), n
			}
			require.NoError(b, ctx.Err(), "%d of %d rows", n, len(msgs))
			time.Sleep(time.Millisecond) // polling the meter's own counter: no query
		}
		end := time.Now()
		cancel()
		require.NoError(b, <-done)
		if firstRows >= len(msgs) {
			return 0 // one batch: no rate after the first
		}
		return float64(len(msgs)-firstRows) / end.Sub(first).Seconds()
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
	var exact bool
	require.NoError(b, with.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_daily) > 0 AND NOT EXISTS (
		SELECT a.account, (e.event_time AT TIME ZONE 'UTC')::date, count(*), sum(e.billable_requests), sum(e.billable_tokens),
		       sum(e.billable_credits), sum(e.billable_cost_micros)
		FROM billable_events e CROSS JOIN LATERAL unnest(e.path) a(account) GROUP BY 1, 2
		EXCEPT SELECT * FROM usage_daily)`).Scan(&exact))
	require.True(b, exact, "usage_daily is the billing log summed")
	b.ReportMetric(median(rw), "with-msgs/s")
	b.ReportMetric(median(rn), "without-msgs/s")
	b.ReportMetric(median(ratios), "with_vs_without")
}
