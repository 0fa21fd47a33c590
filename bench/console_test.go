package main

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/console"
	"github.com/metergate/metergate/internal/testenv"
)

// The console section in miniature against the real stack: it seeds, signs in, times
// every page that answers and measures the viewer's effect in interleaved rounds.
func TestConsoleBench(t *testing.T) {
	ctx := testenv.Context(t, 5*time.Minute)
	cfg := Config{
		BinDir: bin, LogDir: t.TempDir(), Out: filepath.Join(t.TempDir(), "results.json"),
		Space: "metergate_bench_console_test", KeyPrefix: "benchtest:console",
		RedisURL: testenv.RedisURL(t), DatabaseURL: testenv.MigrateDatabaseURL(t), Brokers: testenv.KafkaBrokers(t),
		Duration: time.Second, Warmup: 200 * time.Millisecond, Clients: 8, Rounds: 3, IdempotencyTTL: 24 * time.Hour,
		ConsoleAccounts: 1000, ConsoleEvents: 20_000, ConsoleRequests: 5, ConsoleTabs: 2, ConsoleRefresh: time.Second, ConsoleDuration: time.Second,
		Only: []string{"console"},
	}
	var out bytes.Buffer
	res, err := run(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Empty(t, res.Problems, out.String())

	raw := res.Raw["console"].(map[string]any)
	pages := raw["pages"].([]pageTiming)
	require.NotEmpty(t, pages)
	for _, p := range pages {
		v, ok := res.Value("console_p95_ms_" + p.Name)
		require.True(t, ok, p.Name)
		require.Equal(t, cfg.ConsoleRequests, p.N, p.Name)
		require.LessOrEqual(t, p.ServerP50, v, p.Name)
		require.LessOrEqual(t, v, p.ServerMax, p.Name)
		require.Greater(t, p.Bytes, 0, p.Name)
	}
	// The pages of issue 32's proof that exist now are among them.
	names := map[string]bool{}
	for _, p := range pages {
		names[p.Name] = true
	}
	for _, n := range []string{"accounts_by_id_prefix", "accounts_by_legal_name", "accounts_by_api_key", "account_small_org",
		"account_big_org", "account_user", "why_event", "why_idempotency_key"} {
		require.True(t, names[n], "%s not timed:\n%s", n, out.String())
	}
	seed := raw["seed"].(map[string]float64)
	require.Equal(t, 1000.0, seed["accounts"])
	require.Equal(t, 20_000.0, seed["events"])

	samples := res.Raw["samples"].(map[string]spread)
	for _, k := range []string{"console_viewer_throughput_ratio", "console_same_config_throughput_ratio"} {
		require.Len(t, samples[k].Samples, cfg.Rounds, k)
		v, _ := res.Value(k)
		require.Positive(t, v, k)
	}
	for _, r := range raw["effect_rounds"].([]consoleRound) {
		require.Positive(t, r.Viewer.Loads)
		require.Zero(t, r.Viewer.Errors)
		require.Equal(t, r.Viewer.Loads, r.Viewer.Status["200"], "%v", r.Viewer.Status)
	}
}

func TestServerTiming(t *testing.T) {
	require.Equal(t, 12.3, serverTiming("app;dur=12.3"))
	require.Equal(t, 0.5, serverTiming(`db;dur=3, app;desc="page";dur=0.5`))
	require.True(t, math.IsNaN(serverTiming("")))
	require.True(t, math.IsNaN(serverTiming("db;dur=3")))
	require.True(t, math.IsNaN(serverTiming("app;dur=x")))
}

// The seed runs in named steps, each the statements up to the next step, none lost.
func TestSeedSteps(t *testing.T) {
	steps := seedSteps(consoleSeedSQL)
	var names []string
	for _, st := range steps {
		names = append(names, st.name)
		require.NotContains(t, st.sql, "-- step:", st.name)
	}
	require.Equal(t, []string{"accounts", "events", "corrections", "records"}, names)
	require.Contains(t, steps[1].sql, "attach partition")
	require.Equal(t, []seedStep{{"a", "select 1;\n"}, {"b", "select 2;"}},
		seedSteps("-- header\n-- step: a\nselect 1;\n\n-- step: b\nselect 2;"))
}

// Every GET route of the console is timed or named as not timed: a route added to the
// console is never left out silently.
func TestConsolePagesCoverRoutes(t *testing.T) {
	f := consoleFixture{Big: "con-00001", Small: "con-00042", User: "con-00042-u5", Agent: "con-00042-a7",
		Key: "con-00042-key", Event: "e", Idem: "idem-5", IdemAccount: "con-00042-a1", Run: "r", Webhook: "wh_1"}
	for _, withInvoices := range []bool{false, true} {
		if withInvoices {
			f.Invoice, f.CreditNote = "7", "3"
		}
		pages, skipped := consolePages(f)
		seen := map[string]bool{}
		names := map[string]bool{}
		for _, p := range pages {
			seen[p.Route] = true
			require.False(t, names[p.Name], "two pages named %s", p.Name)
			names[p.Name] = true
			require.True(t, strings.HasPrefix(p.Path, "/console/"), p.Path)
			require.NotContains(t, p.Path, "{", p.Path)
		}
		for _, s := range skipped {
			route, _, _ := strings.Cut(s, ": ")
			seen[route] = true
		}
		for _, r := range console.Routes {
			if strings.HasPrefix(r, "GET ") {
				require.True(t, seen[r], "%s neither timed nor named as not timed", r)
			}
		}
		if withInvoices {
			require.Empty(t, skipped)
		}
	}
}
