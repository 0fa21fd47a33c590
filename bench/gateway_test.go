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
	roundsInMiniature(t, "gateway",
		[]string{"gateway_grpc_cpu_ratio", "gateway_grpc_throughput_ratio", "gateway_check_cpu_ratio", "gateway_check_throughput_ratio"},
		[]string{"gateway_grpc_p50_ms_idle_added", "gateway_check_p50_ms_idle_added"})
}

// roundsInMiniature runs one step of interleaved rounds (gateway, replicas) briefly against
// the real stack and requires every ratio (above 0, one sample a round), every added
// p50, and the step's raw rounds.
func roundsInMiniature(t *testing.T, step string, ratios, added []string) {
	ctx := testenv.Context(t, 5*time.Minute)
	cfg := Config{
		BinDir: bin, LogDir: t.TempDir(), Out: filepath.Join(t.TempDir(), "results.json"),
		Space: "metergate_bench_" + step + "_test", KeyPrefix: "bench" + step + "test:mg",
		RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.MigrateDatabaseURL(t), Brokers: testenv.KafkaBrokers(t),
		Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond, Clients: 8, Rounds: 3,
		IdempotencyTTL: 24 * time.Hour, Only: []string{step},
	}
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Empty(t, res.Problems, out.String())
	samples := res.Raw["samples"].(map[string]spread)
	for _, k := range ratios {
		v, ok := res.Value(k)
		require.True(t, ok, "no %s in\n%s", k, out.String())
		require.Greater(t, v, 0.0, k)
		require.Len(t, samples[k].Samples, cfg.Rounds, k)
	}
	for _, k := range added {
		_, ok := res.Value(k)
		require.True(t, ok, "no %s in\n%s", k, out.String())
	}
	require.NotNil(t, res.Raw[step+"_rounds"])
}
