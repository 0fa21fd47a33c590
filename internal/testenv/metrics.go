package testenv

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// CounterValue is the value of the unlabelled counter name in reg; the test fails when reg
// has no such metric.
func CounterValue(tb testing.TB, reg *prometheus.Registry, name string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	tb.Fatalf("no metric %s", name)
	return 0
}
