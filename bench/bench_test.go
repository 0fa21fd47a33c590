package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

var bin string

func TestMain(m *testing.M) {
	// ./redisrate, the peer, is a module of its own: BuildBinaries builds it in its directory.
	os.Exit(testenv.RunWithBinaries(m, &bin, "../cmd/admit", "../cmd/meter", "../cmd/reconcile", "./loadgen", "./redisrate"))
}

// make bench in miniature, against the real stack: every measurement is taken, every key
// of results.json has a value that makes sense, nothing is left unmeasured. (The Go
// benchmarks it also runs are packages' own; they are left out here.)
func TestBench(t *testing.T) {
	ctx := testenv.Context(t, 10*time.Minute)
	cfg := Config{
		BinDir: bin, LogDir: t.TempDir(), Out: filepath.Join(t.TempDir(), "results.json"),
		Space: "metergate_bench_test", KeyPrefix: "benchtest:mg",
		RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.DatabaseURL(t), Brokers: testenv.KafkaBrokers(t),
		Duration: time.Second, Warmup: 200 * time.Millisecond, Clients: 16,
		Accounts: 2000, E2ERate: 300, EvalshaRequests: 3000,
		Only: []string{"throughput", "idle", "e2e", "pipeline", "memory"}, // "go": the packages' own benchmarks
	}
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Empty(t, res.Problems, out.String())
	require.NoError(t, res.Write(cfg.Out))

	positive := []string{"admit_vs_redis_rate", "admit_vs_redis_rate_relay_running", "admit_redis_efficiency", "admit_vs_evalsha",
		"admit_p50_ms_at_50", "admit_p99_ms_at_50", "admit_p50_ms_at_90", "admit_p99_ms_at_90",
		"admit_p50_ms_idle", "admit_idle_vs_redis_rate", "e2e_p99_ms", "e2e_rate_achieved", "pipeline_p99_ms", "admit_rss_mb_2k"}
	for _, k := range positive {
		v, ok := res.Value(k)
		require.True(t, ok, "no %s in\n%s", k, out.String())
		require.Greater(t, v, 0.0, k)
	}
	p50, _ := res.Value("admit_p50_ms_at_50")
	p99, _ := res.Value("admit_p99_ms_at_50")
	require.LessOrEqual(t, p50, p99)
	// The end-to-end run got what it offered, near enough, and every admitted event is a row.
	e2e := res.Raw["e2e"].(map[string]any)
	require.Equal(t, e2e["admitted"], e2e["rows"])
	require.Greater(t, e2e["admitted"].(int64), int64(0))

	var file struct {
		Results map[string]float64 `json:"results"`
		Figures []Figure           `json:"figures"`
	}
	raw, err := os.ReadFile(cfg.Out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &file))
	require.Len(t, file.Results, len(res.Figures))
	for _, f := range file.Figures {
		require.Equal(t, f.Value, file.Results[f.Key])
		require.NotEmpty(t, f.Against, f.Key)
	}
}

func TestParseBench(t *testing.T) {
	out := `goos: linux
BenchmarkMeterVsInsertSelect-2   	   50000	     41230 ns/op	     21000 baseline-events/s	  11000 meter-events/s	         0.5238 meter_vs_insert_select	    1200 B/op	      14 allocs/op
BenchmarkReconcile/accounts=100000/corrections=1000-2         	       1	2104000000 ns/op	         2.104 s
BenchmarkDecide/serial 	 1000	 300 ns/op
PASS
ok  	github.com/metergate/metergate/pkg/meter	12.1s
`
	got := parseBench(out)
	require.Equal(t, map[string]map[string]float64{
		"BenchmarkMeterVsInsertSelect": {"ns/op": 41230, "baseline-events/s": 21000, "meter-events/s": 11000,
			"meter_vs_insert_select": 0.5238, "B/op": 1200, "allocs/op": 14},
		"BenchmarkReconcile/accounts=100000/corrections=1000": {"ns/op": 2104000000, "s": 2.104},
		"BenchmarkDecide/serial":                              {"ns/op": 300},
	}, got)
}

func TestBenchmarkRPS(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"EVALSHA abc 1 k {"a":"b,c"} b 1","8499.79","5.786","0.584","5.359","9.343","15.271","33.919"
`
	v, err := benchmarkRPS(out)
	require.NoError(t, err)
	require.Equal(t, 8499.79, v)
	_, err = benchmarkRPS("ERROR: NOSCRIPT\n")
	require.Error(t, err)
}

func TestGoals(t *testing.T) {
	r := newResults()
	r.add("a", 0.81, "×", "≥ 0.8", "")
	r.add("b", 0.79, "×", "≥ 0.8", "")
	r.add("c", 0.3, "ms", "≤ 0.3", "")
	r.add("d", 12345.678, "ms", "", "")
	require.True(t, *r.Figures[0].Met)
	require.False(t, *r.Figures[1].Met)
	require.True(t, *r.Figures[2].Met)
	require.Nil(t, r.Figures[3].Met)
	require.Equal(t, 12346.0, r.Figures[3].Value) // four significant digits, whole units kept
	var out bytes.Buffer
	r.Print(&out)
	require.Contains(t, out.String(), "MISSED")
}

func TestReconcileFigures(t *testing.T) {
	r := newResults()
	require.NoError(t, reconcileFigures(r, map[string]map[string]float64{
		recBase:     {"s": 5, "adjustments": 1500},
		recFewer:    {"s": 4},
		recMore:     {"s": 7.5},
		recInactive: {"s": 5.5},
	}))
	for key, want := range map[string]float64{"reconcile_s_100k": 5, "reconcile_vs_100k_at_10k_active": 0.8,
		"reconcile_vs_100k_at_2x_corrections": 1.5, "reconcile_vs_100k_with_1m_inactive": 1.1} {
		v, ok := r.Value(key)
		require.True(t, ok, key)
		require.InDelta(t, want, v, 1e-9, key)
	}
	require.Error(t, reconcileFigures(newResults(), map[string]map[string]float64{recBase: {"s": 5}}))
}
