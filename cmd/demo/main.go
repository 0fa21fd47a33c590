// Command demo is `make demo`: a guided run of the whole pipeline on the local stack
// (make up). It starts bin/admit and bin/meter on a database, Redis key prefix and Kafka
// topic of its own, creates an account tree through admit's admin API, drives synthetic
// traffic through pkg/client, waits until every admitted event is a row in PostgreSQL,
// runs bin/reconcile and a period close, and prints a report (docs/demo.md). It exits 1
// when a step fails or the events admitted are not the rows recorded.
//
//	demo [-duration 30s] [-bin bin] [-database metergate_demo] [-key-prefix demo:mg]
//
// The services come from REDIS_URL, DATABASE_URL and KAFKA_BROKERS (. .run/env);
// DEMO_DURATION sets the default of -duration.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/metergate/metergate/internal/demo"
)

func main() {
	def := 30 * time.Second
	if v := os.Getenv("DEMO_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "demo: DEMO_DURATION=%q: want a Go duration such as 30s\n", v)
			os.Exit(2)
		}
		def = d
	}
	// The database as its owner (DATABASE_MIGRATE_URL when the stack has two roles): the
	// demo makes a space of its own and migrates it.
	cfg := demo.Config{
		RedisURL:    env("REDIS_URL", "redis://127.0.0.1:6379/0"),
		DatabaseURL: env("DATABASE_MIGRATE_URL", env("DATABASE_URL", "postgres://metergate:metergate@127.0.0.1:5432/metergate?sslmode=disable")),
		Brokers:     strings.Split(env("KAFKA_BROKERS", "127.0.0.1:9092"), ","),
		Seed:        uint64(time.Now().UnixNano()),
	}
	flag.DurationVar(&cfg.Duration, "duration", def, "how long the traffic runs (DEMO_DURATION)")
	flag.StringVar(&cfg.BinDir, "bin", "bin", "directory of the admit, meter and reconcile binaries (make build)")
	flag.StringVar(&cfg.Database, "database", "metergate_demo", "the demo's own database, dropped and created at each run (a schema of that name when the role may not create databases)")
	flag.StringVar(&cfg.KeyPrefix, "key-prefix", "demo:mg", "the demo's Redis key prefix (ADMIT_KEY_PREFIX); its keys are deleted at the start")
	flag.StringVar(&cfg.LogDir, "logs", ".run/demo", "directory of the admit, meter and reconcile logs")
	flag.DurationVar(&cfg.DrainTimeout, "drain-timeout", time.Minute, "how long to wait for the last events to reach PostgreSQL")
	flag.BoolVar(&cfg.Console, "console", os.Getenv("DEMO_CONSOLE") != "", "after the report, serve the console of the demo's data until Ctrl-C (DEMO_CONSOLE=1)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if r, err := demo.Run(ctx, cfg, os.Stdout); err != nil {
		msg := err.Error()
		if r != nil && r.Printed { // the report's FAIL lines say it all
			msg, _, _ = strings.Cut(msg, "\n")
			msg += " (the report above has the details)"
		}
		fmt.Fprintf(os.Stderr, "\ndemo failed: %s\n", msg)
		stop()
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
