// Command reconcile is metergate's run-once job for a cron schedule: it compares Redis
// quota counters with the billing log in PostgreSQL and records every correction
// (refund_5xx, refund_void, settle_tokens, period_move, drift_restore) as an adjustments row applied to
// Redis exactly once (see pkg/reconcile and docs/reconcile.md). It exits non-zero when a
// run fails or an invariant check after it does (a correction left unapplied, a counter
// still below its billable total, an issued invoice that no longer ties out).
//
//	reconcile [flags]          one reconcile run (-dry-run: print the plan, change nothing;
//	                           -json: print the summary as one JSON object)
//	reconcile verify [flags]   on a drained pipeline: every quota counter of the open periods
//	                           equals its billable total, and every issued invoice ties out
//	                           (total = lines = priced usage); lists every difference, exit 1
//	reconcile close [-period YYYY-MM] [-force] [-grace 72h]
//	                           freeze a period and issue one invoice per org (refused before
//	                           the period's end plus the grace unless -force; again: no-op);
//	                           without -period, the last month whose end plus grace has passed
//	reconcile invoice -period YYYY-MM -org ID [-format csv|json]
//	                           print an issued invoice
//	reconcile migrate [flags]  apply pending database migrations and exit
//
// Configuration comes from environment variables, each mirrored by a flag (reconcile -h
// lists them); -validate checks it and exits; -migrate applies pending migrations first.
// ADMIT_KEY_PREFIX and ADMIT_SHARDS must be admit's.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/migrations"
	"github.com/metergate/metergate/pkg/admission"
	"github.com/metergate/metergate/pkg/config"
	"github.com/metergate/metergate/pkg/invoice"
	"github.com/metergate/metergate/pkg/period"
	"github.com/metergate/metergate/pkg/policy"
	"github.com/metergate/metergate/pkg/reconcile"
)

// FailpointEnv names a failpoint at which the process kills itself with SIGKILL, for
// crash tests: "<point>:<n>" (e.g. after-redis:3) dies at the n-th time the run reaches
// point (pkg/reconcile's AfterInsert, AfterRedis, AfterMark).
const FailpointEnv = "METERGATE_FAILPOINT"

// errDifferences is verify's failure: counters differ from their billable totals.
var errDifferences = errors.New("counters differ from their billable totals")

// errInvoices is verify's failure: issued invoices do not tie out.
var errInvoices = errors.New("invoice checks fail (finance_invoice_tieout)")

func main() {
	args, sub := os.Args[1:], "run"
	if len(args) > 0 && (args[0] == "migrate" || args[0] == "verify" || args[0] == "close" || args[0] == "invoice") {
		args, sub = args[1:], args[0]
	}
	var cfg config.Reconcile
	config.LoadOrExit(&cfg, "reconcile", args)
	log := cfg.Log.Logger(os.Stderr).With("service", "reconcile", "command", sub)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if sub == "migrate" {
		cfg.Migrate = true
	}
	if err := run(ctx, cfg, log, sub, os.Stdout); err != nil {
		log.Error("reconcile failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config.Reconcile, log *slog.Logger, sub string, out io.Writer) error {
	pool, err := cfg.Postgres.Open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(cctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if cfg.Migrate {
		applied, err := migrations.Up(ctx, pool)
		if err != nil {
			return err
		}
		log.Info("migrations applied", "versions", applied)
	}
	switch sub {
	case "migrate":
		return nil
	case "close", "invoice":
		return runInvoice(ctx, cfg, log, sub, pool, out)
	}

	rdb, err := cfg.Redis.Open()
	if err != nil {
		return err
	}
	defer rdb.Close()
	// A context of its own: the migrations may have used up the first one's time.
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if err := rdb.Ping(rctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	policies := policy.NewCache(pool, log, 0)
	if err := policies.Reload(ctx); err != nil {
		return fmt.Errorf("load policies: %w", err)
	}
	failpoint, err := failpointFromEnv()
	if err != nil {
		return err
	}
	o := reconcile.Options{
		Pool: pool, Redis: rdb, Policies: policies, Log: log, DryRun: cfg.DryRun, Failpoint: failpoint,
		Keys: admission.Keys{Prefix: cfg.KeyPrefix, Shards: cfg.Shards},
	}

	if sub == "verify" {
		diffs, err := reconcile.Verify(ctx, o)
		if err != nil {
			return err
		}
		invoiceDiffs, err := invoice.TieOut(ctx, pool)
		if err != nil {
			return err
		}
		if cfg.JSON {
			if diffs == nil {
				diffs = []reconcile.Difference{}
			}
			if invoiceDiffs == nil {
				invoiceDiffs = []invoice.TieOutDifference{}
			}
			if err := json.NewEncoder(out).Encode(map[string]any{"differences": diffs, "invoice_differences": invoiceDiffs}); err != nil {
				return fmt.Errorf("print differences: %w", err)
			}
		} else {
			for _, d := range diffs {
				fmt.Fprintln(out, d.String())
			}
			for _, d := range invoiceDiffs {
				fmt.Fprintln(out, d.String())
			}
		}
		if len(diffs) > 0 {
			return fmt.Errorf("verify: %d %w", len(diffs), errDifferences)
		}
		if len(invoiceDiffs) > 0 {
			return fmt.Errorf("verify: %d %w", len(invoiceDiffs), errInvoices)
		}
		log.Info("verify passed")
		return nil
	}

	s, err := reconcile.Run(ctx, o)
	if err != nil && !errors.Is(err, reconcile.ErrInvariant) {
		return err
	}
	if !s.DryRun {
		// The issued invoices must still tie out: a check of every run, cheap and lag-free.
		invoiceDiffs, err := invoice.TieOut(ctx, pool)
		if err != nil {
			return err
		}
		for _, d := range invoiceDiffs {
			s.InvariantFailures = append(s.InvariantFailures, d.String())
		}
	}
	if cfg.JSON {
		if err := json.NewEncoder(out).Encode(s); err != nil {
			return fmt.Errorf("print summary: %w", err)
		}
	} else {
		for _, a := range s.Plan {
			fmt.Fprintf(out, "%s %s %s %s %s %+d (%s) %s\n", a.Kind, a.Org, a.Account, a.Unit, a.Period, a.Amount, a.Reason, a.SourceEvent)
		}
		for _, f := range s.InvariantFailures {
			fmt.Fprintln(out, "invariant failed:", f)
		}
		fmt.Fprintf(out, "run %s: dry_run=%t planned=%d applied=%d recovered=%d drift_found=%d events_skipped=%d invariant_failures=%d\n",
			s.RunID, s.DryRun, s.AdjustmentsPlanned, s.AdjustmentsApplied, s.Recovered, s.DriftFound, s.EventsSkipped, len(s.InvariantFailures))
	}
	if len(s.InvariantFailures) > 0 {
		return fmt.Errorf("%d %w", len(s.InvariantFailures), reconcile.ErrInvariant)
	}
	return nil
}

// failpointFromEnv reads FailpointEnv: the returned hook kills the process at the chosen
// point, as kill -9 would.
func failpointFromEnv() (func(string) error, error) {
	v := os.Getenv(FailpointEnv)
	if v == "" {
		return nil, nil
	}
	point, nth, ok := strings.Cut(v, ":")
	n, err := strconv.Atoi(nth)
	if !ok || err != nil || n < 1 {
		return nil, fmt.Errorf("%s=%q: want <point>:<n>", FailpointEnv, v)
	}
	hits := 0
	return func(p string) error {
		if p == point {
			hits++
			if hits == n {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}
		return nil
	}, nil
}

// runInvoice closes a period (close) or prints an issued invoice (invoice).
func runInvoice(ctx context.Context, cfg config.Reconcile, log *slog.Logger, sub string, pool *pgxpool.Pool, out io.Writer) error {
	var month time.Time
	if cfg.Period == "" && sub == "close" {
		// The last month whose end plus the grace has passed: what a monthly CronJob closes.
		month = period.MonthStart(time.Now().Add(-cfg.Grace)).AddDate(0, -1, 0)
	} else {
		p, err := period.ParseMonth(cfg.Period)
		if err != nil {
			return fmt.Errorf("-period: %w", err)
		}
		month = p
	}
	if sub == "invoice" {
		if cfg.Org == "" {
			return errors.New("-org: the org whose invoice to print is required")
		}
		return invoice.Export(ctx, pool, month, cfg.Org, cfg.Format, out)
	}
	res, err := invoice.Close(ctx, pool, month, invoice.Options{Force: cfg.Force, Grace: cfg.Grace, By: "reconcile close"})
	if err != nil {
		return err
	}
	if err := json.NewEncoder(out).Encode(res); err != nil {
		return fmt.Errorf("print the close: %w", err)
	}
	log.Info("period closed", "period", period.MonthLabel(month), "created", res.Created)
	return nil
}
