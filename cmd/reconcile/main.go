// Command reconcile is metergate's run-once job for a cron schedule: it compares Redis
// quota counters with the billing log in PostgreSQL and records every correction
// (refund_5xx, refund_void, settle_tokens, period_move, drift_restore) as an adjustments row applied to
// Redis exactly once (see internal/reconcile and docs/reconcile.md). It exits non-zero when a
// run fails or an invariant check after it does (a correction left unapplied, a counter
// still below its billable total, an issued invoice that no longer ties out).
//
//	reconcile [run] [flags]    one reconcile run (-dry-run: print the plan, change nothing;
//	                           -json: print the summary as one JSON object)
//	reconcile verify [flags]   on a drained pipeline: every quota counter of the open periods
//	                           equals its billable total, and every issued invoice ties out
//	                           (total = lines = priced usage); lists every difference, exit 1
//	reconcile close [-period YYYY-MM] [-force] [-grace 72h]
//	                           freeze a period and issue one invoice per org (refused before
//	                           the period's end plus the grace unless -force; again: no-op);
//	                           without -period, the last month whose end plus grace has passed
//	reconcile invoice -period YYYY-MM -org ID [-format json|csv|pdf|html]
//	                           print an issued invoice
//	reconcile migrate [flags]  apply pending database migrations and exit
//	reconcile help [command]   list the commands, or a command's flags
//
// Configuration comes from environment variables, each mirrored by a flag (reconcile -h
// lists them); -validate checks it and exits; -migrate applies pending migrations first.
// ADMIT_KEY_PREFIX and ADMIT_SHARDS must be admit's. An unknown command exits 2.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/cli"
	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/reconcile"
)

// failpoint is called at internal/reconcile's failpoints. It is nil in the command; a test build
// of it sets it (failpoint_test.go), for crash tests to kill a run at a chosen point.
var failpoint func(point string) error

func main() {
	cli.Main("reconcile", os.Args[1:],
		command("run", "one reconcile run (-dry-run: change nothing; -json)", runOnce),
		command("verify", "check the counters and the issued invoices; list every difference", verify),
		command("close", "close a period: issue one invoice per org (-period, -force, -grace)", closePeriod),
		command("invoice", "print an issued invoice (-period, -org, -format json|csv|pdf|html)", printInvoice),
		command("migrate", "apply pending database migrations and exit", migrate),
	)
}

// env is what a subcommand works with: its configuration, logger, PostgreSQL (migrated
// first with -migrate) and where to print.
type env struct {
	cfg  config.Reconcile
	log  *slog.Logger
	pool *pgxpool.Pool
	out  io.Writer
}

// command is a subcommand of reconcile: it reads the configuration from the environment and
// args (exit 2 when it is bad), connects to PostgreSQL, runs do until SIGINT or SIGTERM,
// and logs do's error and exits 1.
func command(name, summary string, do func(context.Context, env) error) cli.Command {
	return cli.Command{Name: name, Summary: summary, Run: func(args []string) int {
		var cfg config.Reconcile
		config.LoadOrExit(&cfg, "reconcile", args)
		if name == "migrate" {
			cfg.Migrate = true
		}
		log := cfg.Log.Logger(os.Stderr).With("service", "reconcile", "command", name)
		config.RedisLogsTo(log)
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		pool, err := connect(ctx, cfg, log)
		if err == nil {
			defer pool.Close()
			err = do(ctx, env{cfg: cfg, log: log, pool: pool, out: os.Stdout})
		}
		if err != nil {
			log.Error("reconcile failed", "err", err)
			return 1
		}
		return 0
	}}
}

// connect opens PostgreSQL, migrated first with -migrate, and checks that it answers.
func connect(ctx context.Context, cfg config.Reconcile, log *slog.Logger) (*pgxpool.Pool, error) {
	pool, err := cfg.Postgres.OpenMigrated(ctx, cfg.Migrate, log)
	if err != nil || cfg.Migrate { // OpenMigrated checked it before migrating
		return pool, err
	}
	if err := config.Ping(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// migrate has nothing left to do: it is -migrate alone, and command applied the migrations.
func migrate(context.Context, env) error { return nil }

// options opens Redis and loads the policies: what a run and verify need beyond PostgreSQL.
// The caller closes Redis with the returned func.
func (e env) options(ctx context.Context) (reconcile.Options, func(), error) {
	rdb, err := e.cfg.Redis.Open()
	if err != nil {
		return reconcile.Options{}, nil, err
	}
	// A context of its own: the migrations may have used up the first one's time.
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rdb.Ping(rctx).Err(); err != nil {
		_ = rdb.Close()
		return reconcile.Options{}, nil, fmt.Errorf("redis: %w", err)
	}
	policies := policy.NewCache(e.pool, e.log, 0)
	if err := policies.Reload(ctx); err != nil {
		_ = rdb.Close()
		return reconcile.Options{}, nil, fmt.Errorf("load policies: %w", err)
	}
	o := e.cfg.ReconcileOptions(reconcile.Options{Pool: e.pool, Redis: rdb, Policies: policies, Log: e.log, Failpoint: failpoint})
	return o, func() { _ = rdb.Close() }, nil
}
