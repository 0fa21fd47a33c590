package main

import (
	"testing"

	"github.com/metergate/metergate/internal/testenv/failover"
)

// The WAIT measurement in miniature, against the real Sentinel setup: every figure is
// there, from as many rounds as asked.
func TestReplicasBench(t *testing.T) {
	failover.RedisSentinel(t) // the setup the step uses, or unavailable
	roundsInMiniature(t, "replicas", []string{"replicas_wait_throughput_ratio", "replicas_wait_cpu_ratio"},
		[]string{"replicas_wait_p50_ms_idle_added"})
}
