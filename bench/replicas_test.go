package main

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// The WAIT measurement in miniature, against the real Sentinel setup: every figure is
// there, from as many rounds as asked.
func TestReplicasBench(t *testing.T) {
	testenv.RedisSentinel(t) // the setup the step uses, or unavailable
	ctx := testenv.Context(t, 5*time.Minute)
	cfg := Config{
		BinDir: bin, LogDir: t.TempDir(), Out: filepath.Join(t.TempDir(), "results.json"),
		Space: "metergate_bench_replicas_test", KeyPrefix: "benchreptest:mg",
		RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.DatabaseURL(t), Brokers: testenv.KafkaBrokers(t),
		Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond, Clients: 8, Rounds: 3,
		IdempotencyTTL: 24 * time.Hour, Only: []string{"replicas"},
	}
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Empty(t, res.Problems, out.String())
	samples := res.Raw["samples"].(map[string]spread)
	for _, k := range []string{"replicas_wait_throughput_ratio", "replicas_wait_cpu_ratio"} {
		v, ok := res.Value(k)
		require.True(t, ok, "no %s in\n%s", k, out.String())
		require.Greater(t, v, 0.0, k)
		require.Len(t, samples[k].Samples, cfg.Rounds, k)
	}
	_, ok := res.Value("replicas_wait_p50_ms_idle_added")
	require.True(t, ok, "no replicas_wait_p50_ms_idle_added in\n%s", out.String())
	require.NotNil(t, res.Raw["replicas_rounds"])
}
