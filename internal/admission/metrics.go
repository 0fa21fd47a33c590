package admission

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type scriptMetrics struct {
	latency prometheus.Histogram
	batch   prometheus.Histogram
	waiting prometheus.Gauge
	leaves  prometheus.Counter
	// notReplicated counts script calls whose writes fewer replicas than WaitReplicas
	// acknowledged in time.
	notReplicated prometheus.Counter
	// mirrorMisses counts decisions sent again with their program inline.
	mirrorMisses prometheus.Counter
	// logLookups counts idempotency keys looked up in the billing log, by result.
	logLookups *prometheus.CounterVec
}

func newScriptMetrics(reg prometheus.Registerer, a *Admitter) *scriptMetrics {
	m := &scriptMetrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metergate_admit_script_seconds",
			Help:    "Duration of one admission script call (one Redis round trip), by wall clock.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .5},
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metergate_admit_script_batch_size",
			Help:    "Decisions taken per admission script call.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metergate_admit_waiting_requests",
			Help: "Requests waiting on this node for capacity (max_wait_ms) in a limit's queue.",
		}),
		leaves: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_admit_queue_leave_errors_total",
			Help: "Waiting requests whose place could not be taken out of its queue (it stays until its deadline).",
		}),
		notReplicated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_admit_not_replicated_total",
			Help: "Script calls whose writes fewer than ADMIT_REDIS_WAIT_REPLICAS replicas acknowledged in time: their decisions were answered 503 and voided.",
		}),
		mirrorMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_admit_mirror_misses_total",
			Help: "Decisions whose program the Redis policy mirror did not hold (a policy new to it, a wiped or failed-over Redis): sent again at once with the program.",
		}),
		logLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_admit_idempotency_log_lookups_total",
			Help: "Idempotency keys past the hot window that a filter may hold, looked up in the billing log: result found (answered from the log), absent (a filter's false positive: decided afresh) or error (answered 503).",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.latency, m.batch, m.waiting, m.leaves, m.notReplicated, m.mirrorMisses, m.logLookups, &outboxCollector{a: a})
	}
	return m
}

func (m *scriptMetrics) leaveFailed() { m.leaves.Inc() }

func (m *scriptMetrics) logLookup(found bool, err error) {
	result := "absent"
	switch {
	case err != nil:
		result = "error"
	case found:
		result = "found"
	}
	m.logLookups.WithLabelValues(result).Inc()
}

func (m *scriptMetrics) observe(batch int, took time.Duration) {
	m.latency.Observe(took.Seconds())
	m.batch.Observe(float64(batch))
}

// outboxCollector reads the outbox length of every shard when scraped.
type outboxCollector struct{ a *Admitter }

var outboxLength = prometheus.NewDesc("metergate_outbox_length",
	"Usage events in the shard's Redis outbox streams (Keys.Outboxes: not yet relayed to Kafka, or relayed and not yet trimmed).",
	[]string{"shard"}, nil)

var outboxUp = prometheus.NewDesc("metergate_outbox_scrape_ok",
	"1 when the outbox lengths could be read from Redis at this scrape.", nil, nil)

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- outboxLength; ch <- outboxUp }

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	k := c.a.keys
	pipe := c.a.rdb.Pipeline()
	lens := make([][]interface{ Val() int64 }, k.Shards)
	for s := range k.Shards {
		for _, stream := range k.Outboxes(s) {
			lens[s] = append(lens[s], pipe.XLen(ctx, stream))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		ch <- prometheus.MustNewConstMetric(outboxUp, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(outboxUp, prometheus.GaugeValue, 1)
	for s, ls := range lens {
		var n int64
		for _, l := range ls {
			n += l.Val()
		}
		ch <- prometheus.MustNewConstMetric(outboxLength, prometheus.GaugeValue, float64(n), strconv.Itoa(s))
	}
}
