// Command bench is `make bench`: it measures metergate on this machine against baselines
// measured in the same run, prints a table and writes bench/results.json.
//
// Every figure is a ratio against a baseline of the same run, or a latency or a size taken
// beside one, because absolute timings on a shared two-core machine are noise: the load
// generator (bench/loadgen, a process of its own), the services and the measured binaries
// all share the cores. See docs/bench.md for what each key measures and how.
//
// It works in a space of its own on the local stack (make up): PostgreSQL schema or
// database metergate_bench, Redis key prefix bench:mg, a Kafka topic of the run. It runs
// the binaries of bin/ (make build), bin/loadgen and bin/redisrate.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	cfg, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, os.Stdout)
	if res != nil {
		res.Print(os.Stdout)
		if werr := res.Write(cfg.Out); werr != nil {
			err = errors.Join(err, werr)
		} else {
			fmt.Printf("\nwrote %s\n", cfg.Out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// Config is what a run measures and where.
type Config struct {
	BinDir, LogDir string
	// Space is the bench's database (or schema) and KeyPrefix its Redis key prefix; both
	// are emptied at the start. Its Kafka topics are named after Space.
	Space, KeyPrefix string
	RedisURL         string
	DatabaseURL      string
	Brokers          []string
	Out              string // results.json
	// Duration is the measured window of each load run (after Warmup).
	Duration, Warmup time.Duration
	// Clients is the concurrency of the throughput runs (64).
	Clients int
	// Rounds is how many interleaved samples each ratio takes (peer, admit, peer, admit…):
	// the figure is their median, reported with the minimum and maximum.
	Rounds int
	// MemoryN is the fresh accounts (orgs) and the keyed requests of the Redis memory
	// figures: used_memory's delta is divided by it.
	MemoryN int
	// IdempotencyTTL is admit's ADMIT_IDEMPOTENCY_TTL, the window the memory figure of an
	// idempotency record is projected over.
	IdempotencyTTL time.Duration
	// Accounts is the size of the policy cache for admit_rss_mb_100k (100,000).
	Accounts int
	// E2ERate is the offered rate of the end-to-end run (10,000 events/s).
	E2ERate float64
	// EvalshaRequests is redis-benchmark's -n.
	EvalshaRequests int
	// CreditsDecisions is the decisions of each sample of the credits measurement.
	CreditsDecisions int
	// ConsoleAccounts and ConsoleEvents are the accounts and billing-log events seeded for
	// the console's pages; ConsoleRequests the timed requests of each page; ConsoleTabs the
	// auto-refreshing tabs of the console's effect on admission, ConsoleRefresh how often
	// each reloads its pages, and ConsoleDuration the load windows.
	ConsoleAccounts, ConsoleEvents, ConsoleRequests, ConsoleTabs int
	ConsoleRefresh, ConsoleDuration                              time.Duration
	// PortalEvents are the billing-log events of the year the portal section loads for
	// one org; PortalRequests the timed reads of each kind.
	PortalEvents, PortalRequests int
	// Only names the measurements to take (throughput, idle, e2e, pipeline, memory,
	// redismem, waiters, credits, alerts, gateway, replicas, console, portal, sdk, go);
	// empty: all of them.
	Only []string
	// MeterEvents is the events of the meter benchmark (its -benchtime Nx), and
	// ReconcileBenchtime the -benchtime of the reconcile benchmark.
	MeterEvents, ReconcileBenchtime string
	Log                             *slog.Logger
}

// runs reports whether the measurement named name is to be taken.
func (c Config) runs(name string) bool {
	return len(c.Only) == 0 || slices.Contains(c.Only, name)
}

// topicPrefix starts the names of the run's topics: metergate_bench → metergate.bench.
func (c Config) topicPrefix() string { return strings.ReplaceAll(c.Space, "_", ".") + "." }

func parse(args []string) (Config, error) {
	cfg := Config{Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&cfg.BinDir, "bin", "bin", "directory of admit, meter, reconcile, loadgen and redisrate")
	fs.StringVar(&cfg.LogDir, "logs", ".run/bench", "directory for the services' logs")
	fs.StringVar(&cfg.Space, "space", "metergate_bench", "database (or schema) of the run, dropped and created")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", "bench:mg", "Redis key prefix of the run, emptied first")
	fs.StringVar(&cfg.Out, "out", "bench/results.json", "where to write the results")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "measured window of each load run")
	fs.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "load before each measured window")
	fs.IntVar(&cfg.Clients, "clients", 64, "concurrent clients of the throughput runs")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "interleaved samples of each ratio (peer, admit, peer, admit, …)")
	fs.IntVar(&cfg.MemoryN, "memory-n", 20_000, "fresh orgs, and keyed requests, of the Redis memory figures")
	ttl := 24 * time.Hour
	if v := os.Getenv("ADMIT_IDEMPOTENCY_TTL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return cfg, fmt.Errorf("ADMIT_IDEMPOTENCY_TTL: %w", err)
		}
		ttl = d
	}
	fs.DurationVar(&cfg.IdempotencyTTL, "idempotency-ttl", ttl, "admit's ADMIT_IDEMPOTENCY_TTL (default: that variable, else 24h)")
	fs.IntVar(&cfg.Accounts, "accounts", 100_000, "accounts in admit's policy cache for the memory figure")
	fs.Float64Var(&cfg.E2ERate, "e2e-rate", 10_000, "offered rate of the end-to-end run, events/s")
	fs.IntVar(&cfg.EvalshaRequests, "evalsha-requests", 200_000, "redis-benchmark -n")
	fs.IntVar(&cfg.CreditsDecisions, "credits-decisions", 20_000, "decisions of each sample of the credits and alerts measurements")
	fs.IntVar(&cfg.ConsoleAccounts, "console-accounts", 100_000, "accounts seeded for the console's pages (orgs of 50)")
	fs.IntVar(&cfg.ConsoleEvents, "console-events", 1_000_000, "billing-log events seeded for the console's pages")
	fs.IntVar(&cfg.ConsoleRequests, "console-requests", 100, "timed requests of each console page (after 5 warm-ups)")
	fs.IntVar(&cfg.ConsoleTabs, "console-tabs", 5, "auto-refreshing console tabs beside admission's load")
	fs.DurationVar(&cfg.ConsoleRefresh, "console-refresh", time.Second, "how often each console tab reloads the overview and its account page")
	fs.DurationVar(&cfg.ConsoleDuration, "console-duration", 4*time.Second, "load windows of the console's effect on admission")
	fs.IntVar(&cfg.PortalEvents, "portal-events", 10_000_000, "billing-log events of the year of one org the portal section loads")
	fs.IntVar(&cfg.PortalRequests, "portal-requests", 100, "timed reads of each kind of the portal's usage page (after 5 warm-ups)")
	only := fs.String("only", "", "comma-separated measurements to take: throughput, idle, e2e, pipeline, memory, redismem, waiters, credits, alerts, gateway, replicas, console, portal, sdk, go (default: all)")
	fs.StringVar(&cfg.MeterEvents, "meter-events", "100000", "events of the meter benchmark")
	fs.StringVar(&cfg.ReconcileBenchtime, "reconcile-benchtime", "3x", "-benchtime of the reconcile benchmark")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cfg.PortalEvents < 365 || cfg.PortalRequests < 1 {
		return cfg, fmt.Errorf("-portal-events=%d, -portal-requests=%d: want at least 365 and 1", cfg.PortalEvents, cfg.PortalRequests)
	}
	if cfg.Rounds < 1 || cfg.MemoryN < 1 || cfg.ConsoleRequests < 1 || cfg.ConsoleTabs < 1 || cfg.ConsoleEvents < 1 || cfg.ConsoleRefresh <= 0 {
		return cfg, fmt.Errorf("-rounds=%d, -memory-n=%d, -console-requests=%d, -console-tabs=%d, -console-events=%d, -console-refresh=%s: want at least 1",
			cfg.Rounds, cfg.MemoryN, cfg.ConsoleRequests, cfg.ConsoleTabs, cfg.ConsoleEvents, cfg.ConsoleRefresh)
	}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	cfg.RedisURL, cfg.DatabaseURL = os.Getenv("REDIS_URL"), os.Getenv("DATABASE_URL")
	if owner := os.Getenv("DATABASE_MIGRATE_URL"); owner != "" {
		cfg.DatabaseURL = owner // the bench makes a space of its own and migrates it
	}
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		cfg.Brokers = strings.Split(b, ",")
	}
	if cfg.RedisURL == "" || cfg.DatabaseURL == "" || len(cfg.Brokers) == 0 {
		return cfg, errors.New("REDIS_URL, DATABASE_URL and KAFKA_BROKERS must be set (make up writes them to .run/env)")
	}
	var err error
	if cfg.BinDir, err = filepath.Abs(cfg.BinDir); err != nil {
		return cfg, err
	}
	return cfg, nil
}
