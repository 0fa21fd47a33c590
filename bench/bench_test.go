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
		RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.MigrateDatabaseURL(t), Brokers: testenv.KafkaBrokers(t),
		Duration: time.Second, Warmup: 200 * time.Millisecond, Clients: 16, Rounds: 3,
		Accounts: 2000, E2ERate: 300, EvalshaRequests: 3000, MemoryN: 2000, IdempotencyTTL: 24 * time.Hour, CreditsDecisions: 2000,
		Only: []string{"throughput", "idle", "e2e", "pipeline", "memory", "redismem", "waiters", "credits", "alerts"}, // "go": the packages' own benchmarks
	}
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Empty(t, res.Problems, out.String())
	require.NoError(t, res.Write(cfg.Out))

	positive := []string{"admit_vs_redis_rate", "admit_vs_redis_rate_relay_apart",
		"admit_redis_us_per_decision", "redis_rate_redis_us_per_request", "admit_redis_cost_vs_redis_rate", "admit_decisions_per_call",
		"admit_redis_efficiency", "admit_vs_evalsha",
		"admit_p50_ms_at_50", "admit_p99_ms_at_50", "admit_p50_ms_at_90", "admit_p99_ms_at_90",
		"admit_p50_ms_idle", "redis_rate_p50_ms_idle", "admit_idle_vs_redis_rate", "e2e_p99_ms", "e2e_rate_achieved", "pipeline_p99_ms",
		"admit_rss_mb_2k"}
	for _, k := range positive {
		v, ok := res.Value(k)
		require.True(t, ok, "no %s in\n%s", k, out.String())
		require.Greater(t, v, 0.0, k)
	}
	// used_memory deltas over 2,000 small records on a Redis that other tests share are
	// noise-sized: present, not checked for sign (make bench takes 20,000 and more).
	// So are server-wide CPU and script calls over 1 s samples: what waiters cost is read
	// from make bench; TestWaitersDoNotPoll (internal/admission) counts the calls exactly.
	for _, k := range []string{"redis_bytes_per_active_account", "redis_bytes_per_idempotency_record", "redis_gb_idempotency_at_10k_per_s",
		"waiters_1000_redis_cpu_ms_per_s", "waiters_1000_script_calls_per_s", "credits_redis_cost_ratio", "alerts_redis_cost_ratio"} {
		_, ok := res.Value(k)
		require.True(t, ok, "no %s in\n%s", k, out.String())
	}
	// Every ratio against the peer comes from interleaved rounds: at least 3 samples each,
	// the figure their median.
	samples := res.Raw["samples"].(map[string]spread)
	for _, k := range []string{"admit_vs_redis_rate", "admit_vs_redis_rate_relay_apart", "admit_redis_cost_vs_redis_rate",
		"admit_redis_us_per_decision", "redis_rate_redis_us_per_request", "admit_decisions_per_call", "admit_p50_ms_idle", "admit_idle_vs_redis_rate"} {
		sp, ok := samples[k]
		require.True(t, ok, "no samples of %s", k)
		require.Len(t, sp.Samples, cfg.Rounds, k)
		v, _ := res.Value(k)
		require.InEpsilon(t, sp.Median, v, 1e-3, k)
		require.LessOrEqual(t, sp.Min, sp.Median, k)
		require.GreaterOrEqual(t, sp.Max, sp.Median, k)
	}
	// Under 16 clients admit groups decisions: at least one per call.
	perCall, _ := res.Value("admit_decisions_per_call")
	require.GreaterOrEqual(t, perCall, 1.0)
	p50, _ := res.Value("admit_p50_ms_at_50")
	p99, _ := res.Value("admit_p99_ms_at_50")
	require.LessOrEqual(t, p50, p99)
	// The end-to-end run got what it offered, near enough, and every admitted event is a row.
	e2e := res.Raw["e2e"].(map[string]any)
	require.Equal(t, e2e["admitted"], e2e["rows"])
	require.Greater(t, e2e["admitted"].(int64), int64(0))
	// The latency runs to the commit, which comes after the transaction's start.
	lat := e2e["latency"].(latency)
	require.GreaterOrEqual(t, lat.P50, lat.P50Start)
	require.Positive(t, lat.CommitPollMS)

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
ok  	github.com/metergate/metergate/internal/meter	12.1s
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

func TestSpread(t *testing.T) {
	s := spreadOf([]float64{0.7, 0.5, 0.9})
	require.Equal(t, spread{Median: 0.7, Min: 0.5, Max: 0.9, Samples: []float64{0.7, 0.5, 0.9}}, s)
	require.InDelta(t, 0.6, spreadOf([]float64{0.5, 0.9, 0.7, 0.5}).Median, 1e-9)
	r := newResults()
	r.addSpread("a", s, "×", "≥ 0.8", "x")
	v, _ := r.Value("a")
	require.Equal(t, 0.7, v)
	require.False(t, *r.Figures[0].Met)
	require.Contains(t, r.Figures[0].Against, "median of 3 interleaved samples (min 0.5, max 0.9)")
	require.Equal(t, s, r.Raw["samples"].(map[string]spread)["a"])
}

func TestParseCommandStats(t *testing.T) {
	info := parseInfo("# Commandstats\r\ncmdstat_evalsha:calls=10,usec=400,usec_per_call=40.00,rejected_calls=0,failed_calls=1\r\n" +
		"cmdstat_xadd:calls=5,usec=10,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n")
	cs := parseCommandStats(info)
	require.Equal(t, cmdStat{Calls: 10, Usec: 400, Failed: 1}, cs["evalsha"])
	calls, failed := scriptCalls(cs)
	require.Equal(t, 10.0, calls)
	require.Equal(t, 1.0, failed)
	after := map[string]cmdStat{"evalsha": {Calls: 14, Usec: 560, Failed: 1}, "xadd": {Calls: 5, Usec: 10}}
	require.Equal(t, map[string]cmdStat{"evalsha": {Calls: 2, Usec: 80}}, perUnit(cs, after, 2))
}

// A transaction is done at the first snapshot that neither lists it as running nor
// precedes it; a row's 32-bit xmin takes the epoch of the latest snapshot.
func TestCommitClock(t *testing.T) {
	sn, err := parseSnapshot("100:105:101,103")
	require.NoError(t, err)
	require.Equal(t, snapshot{xmin: 100, xmax: 105, xip: []uint64{101, 103}}, sn)
	for xid, done := range map[uint64]bool{99: true, 100: true, 101: false, 102: true, 103: false, 105: false, 200: false} {
		require.Equal(t, done, sn.done(xid), xid)
	}
	_, err = parseSnapshot("100:105")
	require.Error(t, err)
	sn, err = parseSnapshot("7:7:")
	require.NoError(t, err)
	require.Empty(t, sn.xip)

	require.Equal(t, uint64(5<<32|10), widenXID(10, 5<<32|20))
	require.Equal(t, uint64(4<<32|30), widenXID(30, 5<<32|20)) // from before the wrap
	require.Equal(t, uint64(30), widenXID(30, 40))

	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &commitClock{snaps: []snapshot{
		{at: t0, xmin: 100, xmax: 102, xip: []uint64{100, 101}},
		{at: t0.Add(5 * time.Millisecond), xmin: 101, xmax: 104, xip: []uint64{101, 103}},
		{at: t0.Add(10 * time.Millisecond), xmin: 103, xmax: 105, xip: []uint64{103}},
	}}
	at, ok := c.commitTime(100)
	require.True(t, ok)
	require.Equal(t, t0.Add(5*time.Millisecond), at)
	at, ok = c.commitTime(102)
	require.True(t, ok)
	require.Equal(t, t0.Add(5*time.Millisecond), at)
	at, ok = c.commitTime(101)
	require.True(t, ok)
	require.Equal(t, t0.Add(10*time.Millisecond), at)
	_, ok = c.commitTime(99) // done before the clock started
	require.False(t, ok)
	_, ok = c.commitTime(103) // still running at the end
	require.False(t, ok)
	require.Equal(t, 5*time.Millisecond, c.period())
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
