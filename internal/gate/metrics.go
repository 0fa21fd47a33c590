package gate

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/metergate/metergate/internal/admission"
)

type metrics struct {
	decisions  *prometheus.CounterVec
	latency    prometheus.Histogram
	waited     prometheus.Histogram
	rejections *prometheus.CounterVec
	failOpen   prometheus.Counter
	failClosed prometheus.Counter
	abandoned  prometheus.Counter
	voids      *prometheus.CounterVec
	pending    prometheus.Gauge
	shadow     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_admit_decisions_total",
			Help: "Decisions taken, by result and blocking level (empty when allowed).",
		}, []string{"result", "level"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metergate_admit_decision_seconds",
			Help:    "Time to take one decision, from the parsed request to the script's reply.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .5},
		}),
		waited: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metergate_admit_waited_seconds",
			Help:    "Time a request that may wait (max_wait_ms) was held, from the parsed request to its answer; such decisions are not in metergate_admit_decision_seconds.",
			Buckets: []float64{.001, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_admit_shadow_refusals_total",
			Help: "Requests admitted in shadow mode that a limit would have refused, by the refusal (rate_limited, quota_exceeded, insufficient_balance), the blocking level and unit.",
		}, []string{"result", "level", "unit"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_admit_rejected_requests_total",
			Help: "Requests refused before a decision (bad input, credentials), by error code.",
		}, []string{"code"}),
		failOpen: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_admit_fail_open_total",
			Help: "Admissions decided without Redis and recorded straight to Kafka.",
		}),
		failClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_admit_fail_closed_total",
			Help: "Requests denied with 503 because Redis was unavailable.",
		}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_admit_abandoned_total",
			Help: "Admission requests whose caller hung up before the answer (not a Redis outage).",
		}),
		voids: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_admit_voids_total",
			Help: "Requests voided because no caller was told their decision, by reason (unavailable, caller_gone) and where the void was recorded (redis: at once; redis_retried: later, in the background; kafka: straight to Kafka, the last resort when admit stops or Redis stays away; lost: neither took it).",
		}, []string{"reason", "via"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metergate_admit_voids_pending",
			Help: "Voids Redis has not taken yet, retried in the background.",
		}),
	}
	reg.MustRegister(m.decisions, m.shadow, m.latency, m.waited, m.rejections, m.failOpen, m.failClosed, m.abandoned, m.voids, m.pending)
	return m
}

// decided counts a decision and its latency; a request that may wait goes to the waited
// histogram instead, so that waiting does not pass for slowness.
func (m *metrics) decided(d admission.Decision, took time.Duration, mayWait bool) {
	level := ""
	if d.Blocked != nil {
		level = string(d.Blocked.Level)
	}
	m.decisions.WithLabelValues(string(d.Result), level).Inc()
	if sh := d.Shadow; sh != nil && sh.Blocked != nil {
		m.shadow.WithLabelValues(string(sh.Result), string(sh.Blocked.Level), sh.Blocked.Unit).Inc()
	}
	if mayWait {
		m.waited.Observe(took.Seconds())
		return
	}
	m.latency.Observe(took.Seconds())
}

func (m *metrics) rejected(code string) { m.rejections.WithLabelValues(code).Inc() }
