package main

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// The gateway measurement in miniature, against the real stack: every figure is there,
// from as many rounds as asked, and makes sense.
func TestGatewayBench(t *testing.T) {
	ctx := testenv.Context(t, 5*time.Minute)
	cfg := Config{
		BinDir: bin, LogDir: t.TempDir(), Out: filepath.Join(t.TempDir(), "results.json"),
		Space: "metergate_bench_gateway_test", KeyPrefix: "benchgwtest:mg",
		RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.DatabaseURL(t), Brokers: testenv.KafkaBrokers(t),
		Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond, Clients: 8, Rounds: 3,
		IdempotencyTTL: 24 * time.Hour, Only: []string{"gateway"},
	}
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Empty(t, res.Problems, out.String())
	samples := res.Raw["samples"].(map[string]spread)
	for _, k := range []string{"gateway_grpc_cpu_ratio", "gateway_grpc_throughput_ratio", "gateway_check_cpu_ratio", "gateway_check_throughput_ratio"} {
		v, ok := res.Value(k)
		require.True(t, ok, "no %s in\n%s", k, out.String())
		require.Greater(t, v, 0.0, k)
		require.Len(t, samples[k].Samples, cfg.Rounds, k)
	}
	for _, k := range []string{"gateway_grpc_p50_ms_idle_added", "gateway_check_p50_ms_idle_added"} {
		_, ok := res.Value(k)
		require.True(t, ok, "no %s in\n%s", k, out.String())
	}
	rounds := res.Raw["gateway_rounds"]
	require.NotNil(t, rounds)
}
