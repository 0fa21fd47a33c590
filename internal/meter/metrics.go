package meter

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	messages    prometheus.Counter
	rows        *prometheus.CounterVec
	duplicates  *prometheus.CounterVec
	deadLetters prometheus.Counter
	refused     prometheus.Counter
	retries     prometheus.Counter
	commitErrs  prometheus.Counter
	fetchErrs   prometheus.Counter
	batch       prometheus.Histogram
	batchSize   prometheus.Histogram
	lag         prometheus.GaugeFunc
}

func newMetrics(lag func() float64) *metrics {
	return &metrics{
		messages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_meter_messages_total",
			Help: "Kafka messages consumed and written (as rows or dead letters), redeliveries included.",
		}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_meter_rows_inserted_total",
			Help: "Rows inserted, by table (usage_events, usage_borrowings, credit_consumptions, usage_outcomes, usage_voids, usage_alerts, dead_letters).",
		}, []string{"table"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_meter_duplicates_total",
			Help: "Rows skipped because the table already held them (a redelivered or twice-produced message), by table.",
		}, []string{"table"}),
		deadLetters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_meter_dead_letters_total",
			Help: "Messages that could not be parsed or validated, written to dead_letters (redeliveries included).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_meter_refused_total",
			Help: "Messages that passed validation but that PostgreSQL refused for their content, written to dead_letters.",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_meter_write_retries_total",
			Help: "Failed batch writes that were retried (PostgreSQL unavailable, deadlock, ...).",
		}),
		commitErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_meter_commit_errors_total",
			Help: "Kafka offset commits that failed after the batch was written (its messages may be delivered again; the rows dedupe them).",
		}),
		fetchErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_meter_fetch_errors_total",
			Help: "Errors fetching from Kafka (broker unreachable, group not joined, ...); the meter retries.",
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metergate_meter_batch_seconds",
			Help:    "Time to write a batch (PostgreSQL transaction, retries included) and commit its offsets.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metergate_meter_batch_messages",
			Help:    "Messages per batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		lag: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "metergate_meter_lag",
			Help: "Messages between the newest offset and the last one fetched, as the Kafka reader last saw it (kafka-go ReaderStats.Lag: the partition fetched last).",
		}, lag),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, table := range []string{"usage_events", "usage_borrowings", "credit_consumptions", "usage_outcomes", "usage_voids", "usage_alerts", "dead_letters"} { // present from the start, at 0
		m.rows.WithLabelValues(table)
		m.duplicates.WithLabelValues(table)
	}
	for _, c := range []prometheus.Collector{m.messages, m.rows, m.duplicates, m.deadLetters, m.refused, m.retries, m.commitErrs, m.fetchErrs, m.batch, m.batchSize, m.lag} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) observe(w written) {
	for table, c := range map[string]counts{"usage_events": w.usage, "usage_borrowings": w.borrowings, "credit_consumptions": w.credits, "usage_outcomes": w.outcomes, "usage_voids": w.voids, "usage_alerts": w.alerts, "dead_letters": w.deadLetters} {
		m.rows.WithLabelValues(table).Add(float64(c.inserted))
		m.duplicates.WithLabelValues(table).Add(float64(c.staged - c.inserted))
	}
	m.deadLetters.Add(float64(w.deadLetters.staged))
	m.refused.Add(float64(w.refused))
}
