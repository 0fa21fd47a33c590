package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
)

// Failpoints: where Options.Failpoint is called, to test that a run dying there converges.
const (
	// AfterInsert: a batch of corrections is committed, none applied.
	AfterInsert = "after-insert"
	// AfterRedis: one correction changed Redis and is not marked applied yet.
	AfterRedis = "after-redis"
	// AfterMark: one correction is marked applied.
	AfterMark = "after-mark"
	// BeforeCheck: every correction is applied, the invariants are not checked yet.
	BeforeCheck = "before-check"
)

// Options are the dependencies and settings of a run.
type Options struct {
	Pool     *pgxpool.Pool
	Redis    redis.UniversalClient
	Keys     keyspace.Keys
	Policies Policies
	// DryRun computes the plan and changes nothing, in PostgreSQL or Redis.
	DryRun bool
	// Clock gives the run's time, read once at its start (nil: the system clock): the open
	// periods are its month and the month before, and its day and the day before.
	Clock period.Clock
	Log   *slog.Logger
	// MarkerTTL is how long a marker key outlives its correction (40 days when zero).
	MarkerTTL time.Duration
	// CounterRetention is how long a counter created by a correction outlives its period
	// (35 days when zero, as admission's quota counters, monthly and daily).
	CounterRetention time.Duration
	// Failpoint, when set, is called at each failpoint; an error aborts the run there.
	Failpoint func(point string) error

	now time.Time // the run's time, from Clock
}

// Summary is what a run did, printed by reconcile --json and stored in reconcile_runs.
type Summary struct {
	RunID  string `json:"run_id"`
	DryRun bool   `json:"dry_run"`
	Since  string `json:"since"` // first open period, YYYY-MM
	// Recovered counts corrections of earlier runs (that died) applied by this one.
	Recovered          int          `json:"recovered"`
	AdjustmentsPlanned int          `json:"adjustments_planned"`
	AdjustmentsApplied int          `json:"adjustments_applied"`
	ByKind             map[Kind]int `json:"by_kind"`
	// DriftFound counts counters found below their billable total.
	DriftFound int `json:"drift_found"`
	// EventsSkipped counts events whose account no longer resolves to a policy.
	EventsSkipped int `json:"events_skipped"`
	// Plan lists the corrections of a dry run.
	Plan []Adjustment `json:"plan,omitempty"`
	// CreditsPlanned counts the credit corrections computed (balances given back),
	// CreditsApplied those applied to Redis, CreditsRestored the grants brought back to
	// their ledger (docs/credits.md).
	CreditsPlanned  int `json:"credits_planned"`
	CreditsApplied  int `json:"credits_applied"`
	CreditsRestored int `json:"credits_restored"`
	// PlanGrants counts the plans' recurring grants issued for the run's month.
	PlanGrants int `json:"plan_grants"`
	// InvariantFailures lists what the checks after a run found (empty when all hold): a
	// correction left unapplied, one whose recorded Redis values do not differ by its
	// amount, a counter still below its billable total.
	InvariantFailures []string `json:"invariant_failures"`
	// Problems lists the accounts' data the run could not use or correct (empty when
	// none): a counter that is not an integer within ±keyspace.MaxCounter, a billable
	// total past it, a correction, credit or plan grant Redis or PostgreSQL refused. Each
	// was logged and skipped; every other account was reconciled. The run then returns
	// ErrProblems.
	Problems []Problem `json:"problems"`
}

func (o *Options) defaults() error {
	if o.Pool == nil || o.Redis == nil || o.Policies == nil {
		return errors.New("reconcile: Pool, Redis and Policies are required")
	}
	if o.Keys.Prefix == "" {
		o.Keys.Prefix = keyspace.DefaultKeyPrefix
	}
	if o.Keys.Shards <= 0 {
		o.Keys.Shards = keyspace.DefaultShards
	}
	o.now = o.Clock.Now()
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.MarkerTTL <= 0 {
		o.MarkerTTL = 40 * 24 * time.Hour
	}
	if o.CounterRetention <= 0 {
		o.CounterRetention = keyspace.DefaultQuotaRetention
	}
	return nil
}

func (o *Options) fail(point string) error {
	if o.Failpoint == nil {
		return nil
	}
	if err := o.Failpoint(point); err != nil {
		return fmt.Errorf("failpoint %s: %w", point, err)
	}
	return nil
}

// since is the first day of the first open month: the month before Now's.
func since(now time.Time) time.Time {
	now = now.UTC()
	return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, -1, 0)
}

// sinceDay is the first open day: the day before Now's.
func sinceDay(now time.Time) time.Time {
	now = now.UTC()
	return time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC).AddDate(0, 0, -1)
}

// Run computes the corrections, records and applies them (or, with DryRun, only lists
// them) and returns the summary. Order: corrections left pending by an earlier run,
// then period moves, refunds and settlements of events, then drift against the billable
// totals (measured after the others are applied).
func Run(ctx context.Context, o Options) (Summary, error) {
	if err := o.defaults(); err != nil {
		return Summary{}, err
	}
	runID := uuid.New()
	from := since(o.now)
	s := Summary{RunID: runID.String(), DryRun: o.DryRun, Since: period.MonthLabel(from), ByKind: map[Kind]int{},
		InvariantFailures: []string{}, Problems: []Problem{}}

	if o.DryRun {
		if err := plan(ctx, o, from, &s); err != nil {
			return s, err
		}
		return s, s.problemsErr()
	}

	unlock, err := lockRun(ctx, o.Pool)
	if err != nil {
		return s, err
	}
	defer unlock()

	if _, err := o.Pool.Exec(ctx, `insert into reconcile_runs (run_id) values (@run_id)`, pgx.StrictNamedArgs{"run_id": runID}); err != nil {
		return s, fmt.Errorf("record run: %w", err)
	}
	recovered, err := apply(ctx, o, &s)
	if err != nil {
		return s, err
	}
	s.Recovered = recovered

	events, skipped, err := eventCorrections(ctx, o, from)
	if err != nil {
		return s, err
	}
	s.EventsSkipped = skipped
	if err := insert(ctx, o, runID, events); err != nil {
		return s, err
	}
	s.AdjustmentsPlanned += len(events)
	if _, err := apply(ctx, o, &s); err != nil {
		return s, err
	}

	if err := issuePlanGrants(ctx, o, &s); err != nil {
		return s, err
	}
	if err := credits(ctx, o, &s); err != nil {
		return s, err
	}

	// Fail-open events metered after the drift pass charged no counter yet: the checks
	// leave them to the next run.
	var cutoff time.Time
	if err := o.Pool.QueryRow(ctx, `select clock_timestamp()`).Scan(&cutoff); err != nil {
		return s, fmt.Errorf("read database clock: %w", err)
	}
	drift, _, problems, err := driftCorrections(ctx, o, from, nil, true, nil)
	if err != nil {
		return s, err
	}
	for _, p := range problems {
		s.problem(o, p)
	}
	s.DriftFound = len(drift)
	if err := insert(ctx, o, runID, drift); err != nil {
		return s, err
	}
	s.AdjustmentsPlanned += len(drift)
	if _, err := apply(ctx, o, &s); err != nil {
		return s, err
	}

	if err := o.fail(BeforeCheck); err != nil {
		return s, err
	}
	if s.InvariantFailures, err = checkInvariants(ctx, o, runID, from, cutoff); err != nil {
		return s, err
	}
	if _, err := o.Pool.Exec(ctx, `update reconcile_runs set finished_at = now(), summary = @summary where run_id = @run_id`,
		pgx.StrictNamedArgs{"run_id": runID, "summary": s}); err != nil {
		return s, fmt.Errorf("record run summary: %w", err)
	}
	o.Log.Info("reconcile run finished", "run_id", s.RunID, "adjustments_applied", s.AdjustmentsApplied,
		"recovered", s.Recovered, "drift_found", s.DriftFound, "events_skipped", s.EventsSkipped,
		"invariant_failures", len(s.InvariantFailures), "problems", len(s.Problems))
	var errs []error
	if len(s.InvariantFailures) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvariant, strings.Join(s.InvariantFailures, "; ")))
	}
	errs = append(errs, s.problemsErr())
	return s, errors.Join(errs...)
}

// problemsErr is ErrProblems with their count when the summary lists problems, else nil.
func (s *Summary) problemsErr() error {
	if len(s.Problems) == 0 {
		return nil
	}
	return fmt.Errorf("%d accounts' data: %w", len(s.Problems), ErrProblems)
}

// plan fills s with what a run would do, changing nothing: the corrections left pending,
// the event corrections, then the drift measured as if the pending ones were applied.
func plan(ctx context.Context, o Options, from time.Time, s *Summary) error {
	pending, err := pendingRows(ctx, o.Pool)
	if err != nil {
		return err
	}
	events, skipped, err := eventCorrections(ctx, o, from)
	if err != nil {
		return err
	}
	s.EventsSkipped = skipped
	listed := append(pending, events...)
	// Drift is measured against the corrections recorded (pending ones included, as if
	// applied); the new event corrections are not recorded, so they count on neither side.
	// A pending row whose marker is there has reached Redis already (its run died before
	// marking it): its delta is in the counter read.
	planned := map[string]int64{}
	pipe := o.Redis.Pipeline()
	applied := make([]*redis.IntCmd, len(pending))
	for i, a := range pending {
		applied[i] = pipe.Exists(ctx, o.Keys.Marker(a.Org, a.ID))
	}
	if len(pending) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("read markers: %w", err)
		}
	}
	for i, a := range pending {
		if applied[i].Val() == 0 {
			planned[o.Keys.Quota(a.Org, a.Account, a.Unit, a.Period)] += a.Amount
		}
	}
	drift, _, problems, err := driftCorrections(ctx, o, from, planned, true, nil)
	if err != nil {
		return err
	}
	for _, p := range problems {
		s.problem(o, p)
	}
	s.DriftFound = len(drift)
	s.Plan = append(listed, drift...)
	s.AdjustmentsPlanned = len(s.Plan)
	for _, a := range s.Plan {
		s.ByKind[a.Kind]++
	}
	return nil
}

// lockRun takes the run lock: one run at a time, since two runs measuring the same drift
// would both restore it. The session lock goes with the connection, so a run killed with -9
// releases it. unlock releases it, or closes the session when that fails.
func lockRun(ctx context.Context, pool *pgxpool.Pool) (unlock func(), err error) {
	lock, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire lock connection: %w", err)
	}
	var locked bool
	if err := lock.QueryRow(ctx, `select pg_try_advisory_lock(hashtext('metergate.reconcile.' || current_schema()))`).Scan(&locked); err != nil {
		lock.Release()
		return nil, fmt.Errorf("take run lock: %w", err)
	}
	if !locked {
		lock.Release()
		return nil, ErrRunning
	}
	return func() {
		defer lock.Release()
		// A fresh context: the run's may be done; the lock must not stay with a pooled connection.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := lock.Exec(uctx, `select pg_advisory_unlock(hashtext('metergate.reconcile.' || current_schema()))`); err != nil {
			_ = lock.Conn().Close(uctx) // closing the session releases the lock
		}
	}, nil
}
