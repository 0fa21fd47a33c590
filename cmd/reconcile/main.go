// Command reconcile is metergate's run-once job for a cron schedule: it compares Redis
// quota counters with the billing log in PostgreSQL and records every correction
// (refund_5xx, settle_tokens, period_move, drift_restore) as an adjustments row applied to
// Redis exactly once (see pkg/reconcile and docs/reconcile.md). It exits non-zero when a
// run fails.
//
//	reconcile [flags]          one reconcile run (-dry-run: print the plan, change nothing;
//	                           -json: print the summary as one JSON object)
//	reconcile verify [flags]   on a drained pipeline: every quota counter of the open periods
//	                           equals its billable total; lists every difference, exit 1
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

	"github.com/metergate/metergate/migrations"
	"github.com/metergate/metergate/pkg/admission"
	"github.com/metergate/metergate/pkg/config"
	"github.com/metergate/metergate/pkg/policy"
	"github.com/metergate/metergate/pkg/reconcile"
)

// FailpointEnv names a failpoint at which the process kills itself with SIGKILL, for
// crash tests: "<point>:<n>" (e.g. after-redis:3) dies at the n-th time the run reaches
// point (pkg/reconcile's AfterInsert, AfterRedis, AfterMark).
const FailpointEnv = "METERGATE_FAILPOINT"

// errDifferences is verify's failure: counters differ from their billable totals.
var errDifferences = errors.New("counters differ from their billable totals")

func main() {
	args, sub := os.Args[1:], "run"
	if len(args) > 0 && (args[0] == "migrate" || args[0] == "verify") {
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
	if sub == "migrate" {
		return nil
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
		if cfg.JSON {
			if diffs == nil {
				diffs = []reconcile.Difference{}
			}
			if err := json.NewEncoder(out).Encode(map[string]any{"differences": diffs}); err != nil {
				return fmt.Errorf("print differences: %w", err)
			}
		} else {
			for _, d := range diffs {
				fmt.Fprintln(out, d.String())
			}
		}
		if len(diffs) > 0 {
			return fmt.Errorf("verify: %d %w", len(diffs), errDifferences)
		}
		log.Info("verify passed")
		return nil
	}

	s, err := reconcile.Run(ctx, o)
	if err != nil {
		return err
	}
	if cfg.JSON {
		if err := json.NewEncoder(out).Encode(s); err != nil {
			return fmt.Errorf("print summary: %w", err)
		}
		return nil
	}
	for _, a := range s.Plan {
		fmt.Fprintf(out, "%s %s %s %s %s %+d (%s) %s\n", a.Kind, a.Org, a.Account, a.Unit, a.Period, a.Amount, a.Reason, a.SourceEvent)
	}
	fmt.Fprintf(out, "run %s: dry_run=%t planned=%d applied=%d recovered=%d drift_found=%d events_skipped=%d\n",
		s.RunID, s.DryRun, s.AdjustmentsPlanned, s.AdjustmentsApplied, s.Recovered, s.DriftFound, s.EventsSkipped)
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
