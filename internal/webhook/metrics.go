package webhook

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	attempts          *prometheus.CounterVec
	latency           prometheus.Histogram
	disabled          prometheus.Counter
	pending           prometheus.Gauge
	oldestDue         prometheus.Gauge
	endpointsDisabled prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metergate_webhook_attempts_total",
			Help: "Webhook delivery attempts, by result: delivered (2xx), http_error (another status), error (timeout, refused target, connection).",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metergate_webhook_attempt_seconds",
			Help:    "Time of a webhook attempt, connection to the end of the reply.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		disabled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metergate_webhook_endpoints_disabled_total",
			Help: "Endpoints this deliverer disabled after a run of failed attempts (or a 410 Gone).",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metergate_webhook_pending_deliveries",
			Help: "Deliveries pending (due or waiting for a retry), refreshed every few seconds.",
		}),
		oldestDue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metergate_webhook_oldest_due_seconds",
			Help: "How long the oldest due delivery of an enabled endpoint has waited past its time (0: none).",
		}),
		endpointsDisabled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metergate_webhook_endpoints_disabled",
			Help: "Endpoints disabled now (by the deliverer or through the admin API).",
		}),
	}
	reg.MustRegister(m.attempts, m.latency, m.disabled, m.pending, m.oldestDue, m.endpointsDisabled)
	return m
}
