// Package reconcile corrects the Redis quota counters that admission charges from the
// billing log in PostgreSQL. Each correction is recorded as a row of adjustments, applied to
// Redis exactly once (lua/adjust.lua writes a marker key named after the row in the same
// script as the counter change), then marked applied. A run that dies anywhere is finished
// by the next one, and a run right after a clean one applies nothing.
//
// Monthly counters are corrected for the open months (the run's and the one before), daily
// counters for the open days (the run's and the one before).
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/lua"
	"github.com/metergate/metergate/pkg/admission"
	"github.com/metergate/metergate/pkg/period"
	"github.com/metergate/metergate/pkg/policy"
)

// Kind is the kind of a correction.
type Kind string

// The kinds of correction, in the order a run computes them.
const (
	// PeriodMove moves usage charged to another month than its event time's: minus from
	// the charged month's counter, plus to the event time's.
	PeriodMove Kind = "period_move"
	// Refund5xx gives back the quota of a request whose outcome was a 5xx.
	Refund5xx Kind = "refund_5xx"
	// RefundVoid gives back the quota of a request that no caller was told 200 for
	// (usage_voids): admit answered 503 after an unknown outcome, or the caller hung up.
	RefundVoid Kind = "refund_void"
	// SettleTokens replaces estimated units by the actual ones an outcome reported.
	SettleTokens Kind = "settle_tokens"
	// DriftRestore raises a counter found below PostgreSQL's billable total.
	DriftRestore Kind = "drift_restore"
)

// ErrRunning is returned when another run holds the run lock.
var ErrRunning = errors.New("another reconcile run is in progress")

// ErrInvariant is returned, with the summary, when a run finished but the checks after it
// failed (Summary.InvariantFailures lists them).
var ErrInvariant = errors.New("reconcile invariant check failed")

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

// Policies resolves an account's effective policy (a *policy.Cache).
type Policies interface {
	Resolve(account string) (policy.Resolved, error)
}

// Options are the dependencies and settings of a run.
type Options struct {
	Pool     *pgxpool.Pool
	Redis    redis.UniversalClient
	Keys     admission.Keys
	Policies Policies
	// DryRun computes the plan and changes nothing, in PostgreSQL or Redis.
	DryRun bool
	// Now is the run's time (time.Now when zero): the open periods are its month and the
	// month before, and its day and the day before.
	Now time.Time
	Log *slog.Logger
	// MarkerTTL is how long a marker key outlives its correction (40 days when zero).
	MarkerTTL time.Duration
	// CounterRetention is how long a counter created by a correction outlives its period
	// (35 days when zero, as admission's quota counters, monthly and daily).
	CounterRetention time.Duration
	// Failpoint, when set, is called at each failpoint; an error aborts the run there.
	Failpoint func(point string) error
}

// Adjustment is one correction of one quota counter.
type Adjustment struct {
	ID      int64       `json:"id,omitempty"`
	Kind    Kind        `json:"kind"`
	Org     string      `json:"org"`
	Account string      `json:"account"`
	Level   policy.Kind `json:"level"`
	Unit    policy.Unit `json:"unit"`
	// QuotaPeriod is the window of the counter: month (Period is YYYY-MM) or day (YYYY-MM-DD).
	QuotaPeriod policy.QuotaPeriod `json:"quota_period"`
	Period      string             `json:"period"`
	Amount      int64              `json:"amount"`
	Reason      string             `json:"reason"`
	SourceEvent string             `json:"source_event,omitempty"`
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
	// InvariantFailures lists what the checks after a run found (empty when all hold): a
	// correction left unapplied, one whose recorded Redis values do not differ by its
	// amount, a counter still below its billable total.
	InvariantFailures []string `json:"invariant_failures"`
}

// Difference is a counter that does not equal its billable total.
type Difference struct {
	Org         string             `json:"org"`
	Account     string             `json:"account"`
	Level       policy.Kind        `json:"level"`
	Unit        policy.Unit        `json:"unit"`
	QuotaPeriod policy.QuotaPeriod `json:"quota_period"`
	Period      string             `json:"period"` // YYYY-MM, or YYYY-MM-DD for a daily counter
	Redis       int64              `json:"redis"`
	Billable    int64              `json:"billable"`
}

func (d Difference) String() string {
	return fmt.Sprintf("%s %s %s %s: redis %d, billable %d", d.Org, d.Account, d.Unit, d.Period, d.Redis, d.Billable)
}

func (o *Options) defaults() error {
	if o.Pool == nil || o.Redis == nil || o.Policies == nil {
		return errors.New("reconcile: Pool, Redis and Policies are required")
	}
	if o.Keys.Prefix == "" {
		o.Keys.Prefix = admission.DefaultKeyPrefix
	}
	if o.Keys.Shards <= 0 {
		o.Keys.Shards = 16
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.MarkerTTL <= 0 {
		o.MarkerTTL = 40 * 24 * time.Hour
	}
	if o.CounterRetention <= 0 {
		o.CounterRetention = 35 * 24 * time.Hour
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
	from := since(o.Now)
	s := Summary{RunID: runID.String(), DryRun: o.DryRun, Since: period.MonthLabel(from), ByKind: map[Kind]int{},
		InvariantFailures: []string{}}

	if o.DryRun {
		pending, err := pendingRows(ctx, o.Pool)
		if err != nil {
			return s, err
		}
		events, skipped, err := eventCorrections(ctx, o, from)
		if err != nil {
			return s, err
		}
		s.EventsSkipped = skipped
		plan := append(pending, events...)
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
				return s, fmt.Errorf("read markers: %w", err)
			}
		}
		for i, a := range pending {
			if applied[i].Val() == 0 {
				planned[o.Keys.Quota(a.Org, a.Account, a.Unit, a.Period)] += a.Amount
			}
		}
		drift, _, err := driftCorrections(ctx, o, from, planned, true, nil)
		if err != nil {
			return s, err
		}
		s.DriftFound = len(drift)
		s.Plan = append(plan, drift...)
		s.AdjustmentsPlanned = len(s.Plan)
		for _, a := range s.Plan {
			s.ByKind[a.Kind]++
		}
		return s, nil
	}

	// One run at a time: two runs measuring the same drift would both restore it. The
	// session lock goes with the connection, so a run killed with -9 releases it.
	lock, err := o.Pool.Acquire(ctx)
	if err != nil {
		return s, fmt.Errorf("acquire lock connection: %w", err)
	}
	defer lock.Release()
	var locked bool
	if err := lock.QueryRow(ctx, `select pg_try_advisory_lock(hashtext('metergate.reconcile.' || current_schema()))`).Scan(&locked); err != nil {
		return s, fmt.Errorf("take run lock: %w", err)
	}
	if !locked {
		return s, ErrRunning
	}
	defer func() {
		// A fresh context: the run's may be done; the lock must not stay with a pooled connection.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := lock.Exec(uctx, `select pg_advisory_unlock(hashtext('metergate.reconcile.' || current_schema()))`); err != nil {
			_ = lock.Conn().Close(uctx) // closing the session releases the lock
		}
	}()

	if _, err := o.Pool.Exec(ctx, `insert into reconcile_runs (run_id) values ($1)`, runID); err != nil {
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

	// Fail-open events metered after the drift pass charged no counter yet: the checks
	// leave them to the next run.
	var cutoff time.Time
	if err := o.Pool.QueryRow(ctx, `select clock_timestamp()`).Scan(&cutoff); err != nil {
		return s, fmt.Errorf("read database clock: %w", err)
	}
	drift, _, err := driftCorrections(ctx, o, from, nil, true, nil)
	if err != nil {
		return s, err
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
	if _, err := o.Pool.Exec(ctx, `update reconcile_runs set finished_at = now(), summary = $2 where run_id = $1`, runID, s); err != nil {
		return s, fmt.Errorf("record run summary: %w", err)
	}
	o.Log.Info("reconcile run finished", "run_id", s.RunID, "adjustments_applied", s.AdjustmentsApplied,
		"recovered", s.Recovered, "drift_found", s.DriftFound, "events_skipped", s.EventsSkipped,
		"invariant_failures", len(s.InvariantFailures))
	if len(s.InvariantFailures) > 0 {
		return s, fmt.Errorf("%w: %s", ErrInvariant, strings.Join(s.InvariantFailures, "; "))
	}
	return s, nil
}

// checkInvariants checks what must hold after a run whatever the pipeline's lag: every
// correction is applied; each applied correction of this run changed its counter by its
// amount; no counter is below its billable total (a counter above it is admissions not
// metered yet, which verify on a drained pipeline catches).
func checkInvariants(ctx context.Context, o Options, runID uuid.UUID, from, cutoff time.Time) ([]string, error) {
	failures := []string{}
	pending, err := pendingRows(ctx, o.Pool)
	if err != nil {
		return nil, err
	}
	for _, a := range pending {
		failures = append(failures, fmt.Sprintf("adjustment %d (%s %s %s %s) not applied", a.ID, a.Kind, a.Account, a.Unit, a.Period))
	}
	rows, err := o.Pool.Query(ctx, `select format('adjustment %s (%s %s %s): redis %s -> %s is not %s', id, kind, account, unit, redis_before, redis_after, amount)
from adjustments where run_id = $1 and applied_at is not null and redis_after - redis_before <> amount order by id`, runID)
	if err != nil {
		return nil, fmt.Errorf("check applied adjustments: %w", err)
	}
	bad, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("check applied adjustments: %w", err)
	}
	failures = append(failures, bad...)
	_, diffs, err := driftCorrections(ctx, o, from, nil, true, &cutoff)
	if err != nil {
		return nil, err
	}
	for _, d := range diffs {
		if d.Redis < d.Billable {
			failures = append(failures, "counter below its billable total after the run: "+d.String())
		}
	}
	return failures, nil
}

// Verify compares, for every (account, unit, open period) with a quota (monthly or daily)
// that the billing log has usage for, the Redis counter with the billable total: admitted
// units, minus those of 5xx outcomes, with actual units in place of estimates; and reports
// every other non-zero quota counter of the open periods found in Redis (billable 0). On a
// drained pipeline after a reconcile run the list is empty.
func Verify(ctx context.Context, o Options) ([]Difference, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	from := since(o.Now)
	_, diffs, err := driftCorrections(ctx, o, from, nil, false, nil)
	if err != nil {
		return nil, err
	}
	// Counters of accounts without any usage in the log (events lost on the way, or
	// counters no event explains) are found by scanning Redis.
	checked := map[string]bool{}
	totals, err := billableCounters(ctx, o, from, false, nil)
	if err != nil {
		return nil, err
	}
	for _, c := range totals {
		checked[c.key] = true
	}
	stray, err := strayCounters(ctx, o, from, checked)
	if err != nil {
		return nil, err
	}
	return append(diffs, stray...), nil
}

// strayCounters lists the quota counters of the open periods that are not in checked and
// hold a value other than 0: each is a difference from a billable total of 0.
func strayCounters(ctx context.Context, o Options, from time.Time, checked map[string]bool) ([]Difference, error) {
	var labels []string
	for m := from; !m.After(o.Now); m = m.AddDate(0, 1, 0) {
		labels = append(labels, period.MonthLabel(m))
	}
	for d := sinceDay(o.Now); !d.After(o.Now); d = d.AddDate(0, 0, 1) {
		labels = append(labels, period.DayLabel(d))
	}
	var out []Difference
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		for _, label := range labels {
			iter := c.Scan(ctx, 0, o.Keys.QuotaPattern(label), 1000).Iterator()
			for iter.Next(ctx) {
				key := iter.Val()
				if checked[key] {
					continue
				}
				account, unit, keyLabel, ok := o.Keys.ParseQuota(key)
				if !ok {
					continue // not a quota counter of this prefix
				}
				v, err := c.Get(ctx, key).Int64()
				if errors.Is(err, redis.Nil) || (err == nil && v == 0) {
					continue
				}
				if err != nil {
					return fmt.Errorf("read counter %s: %w", key, err)
				}
				d := Difference{Account: account, Unit: unit, QuotaPeriod: policy.KindOf(keyLabel), Period: keyLabel, Redis: v}
				if pol, err := o.Policies.Resolve(account); err == nil {
					d.Org, d.Level = pol.Org, pol.Path[len(pol.Path)-1].Kind
				}
				out = append(out, d)
			}
			if err := iter.Err(); err != nil {
				return fmt.Errorf("scan counters: %w", err)
			}
		}
		return nil
	}
	if cc, ok := o.Redis.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock() // out is shared; masters are few
			defer mu.Unlock()
			return scan(ctx, c)
		})
		return out, err
	}
	return out, scan(ctx, o.Redis)
}

// quotas lists the units that a level counts with a quota counter of window q (capped or
// not: admission charges the counter of every limit with a quota).
func quotas(lv policy.Level, q policy.QuotaPeriod) []policy.Unit {
	var units []policy.Unit
	for _, u := range policy.Units {
		l, ok := lv.Limits[u]
		if ok && l.Quota != nil && (l.QuotaPeriod == q || l.QuotaPeriod == "" && q == policy.Month) {
			units = append(units, u)
		}
	}
	return units
}

func unitIndex(u policy.Unit) int {
	for i, v := range policy.Units {
		if v == u {
			return i
		}
	}
	return -1
}

// eventCorrections computes the period moves, refunds and settlements of the events of the
// open periods that have not had them yet. Events admitted fail-open charged no counter
// and get none (drift_restore brings their usage into the counters).
//
// Admission charges a daily counter of the day of the event time (both come from Redis
// TIME), so daily counters need no moves; they are refunded and settled while their day is
// open. An event's corrections are computed together, once.
//
// The cost follows the events of the open periods, not the log's whole history: each looks
// up its outcome by key (usage_outcomes is not partitioned: joined as a table, PostgreSQL
// hashes every outcome ever written; the LIMIT, a no-op on the key, keeps it a lookup) and
// its corrections in adjustments_event_key.
func eventCorrections(ctx context.Context, o Options, from time.Time) ([]Adjustment, int, error) {
	fromDay := sinceDay(o.Now)
	rows, err := o.Pool.Query(ctx, `
select e.event_id, e.org, e.account, e.charged_period, e.billing_period, e.event_time,
       array[e.requests, e.tokens, e.credits, e.cost_micros],
       o.status, array[o.requests, o.tokens, o.credits, o.cost_micros],
       exists (select 1 from adjustments a where a.kind = 'period_move' and a.source_event = e.event_id),
       exists (select 1 from adjustments a where a.kind in ('refund_5xx', 'refund_void', 'settle_tokens') and a.source_event = e.event_id),
       v.reason
from usage_events e
left join lateral (select * from usage_outcomes o where o.event_id = e.event_id limit 1) o on true
left join usage_voids v on v.event_id = e.event_id
where e.billing_period >= $1 and not e.fail_open
  and ((e.charged_period <> e.billing_period
        and not exists (select 1 from adjustments a where a.kind = 'period_move' and a.source_event = e.event_id))
    or ((o.status >= 500 or num_nonnulls(o.requests, o.tokens, o.credits, o.cost_micros) > 0 or v.event_id is not null)
        and not exists (select 1 from adjustments a where a.kind in ('refund_5xx', 'refund_void', 'settle_tokens') and a.source_event = e.event_id)))
order by e.event_time, e.event_id`, from)
	if err != nil {
		return nil, 0, fmt.Errorf("read events to correct: %w", err)
	}
	defer rows.Close()
	var (
		out     []Adjustment
		skipped int
	)
	for rows.Next() {
		var (
			id, org, account string
			charged, billing time.Time
			at               time.Time
			est              []int64
			status           *int
			actual           []*int64
			moved, settled   bool
			voided           *string // the void's reason
		)
		if err := rows.Scan(&id, &org, &account, &charged, &billing, &at, &est, &status, &actual, &moved, &settled, &voided); err != nil {
			return nil, 0, fmt.Errorf("read events to correct: %w", err)
		}
		pol, err := o.Policies.Resolve(account)
		if err != nil {
			o.Log.Warn("event skipped: account does not resolve", "event_id", id, "account", account, "err", err)
			skipped++
			continue
		}
		cp, bp := period.MonthLabel(charged), period.MonthLabel(billing)
		add := func(k Kind, lv policy.Level, u policy.Unit, period string, amount int64, reason string) {
			if amount != 0 {
				out = append(out, Adjustment{Kind: k, Org: org, Account: lv.Account, Level: lv.Kind, Unit: u,
					QuotaPeriod: policy.KindOf(period), Period: period, Amount: amount, Reason: reason, SourceEvent: id})
			}
		}
		// settle refunds or settles the counter of period.
		settle := func(lv policy.Level, u policy.Unit, period string) {
			n := est[unitIndex(u)]
			switch {
			case settled:
			case voided != nil: // whatever its outcome says: nobody was told 200
				add(RefundVoid, lv, u, period, -n, "voided: "+*voided)
			case status == nil:
			case *status >= 500:
				add(Refund5xx, lv, u, period, -n, fmt.Sprintf("outcome status %d", *status))
			case actual[unitIndex(u)] != nil:
				a := *actual[unitIndex(u)]
				add(SettleTokens, lv, u, period, a-n, fmt.Sprintf("estimated %d, actual %d", n, a))
			}
		}
		for _, lv := range pol.Path {
			for _, u := range quotas(lv, policy.Month) {
				n := est[unitIndex(u)]
				// Moves first: refunds and settlements then apply to the event time's month.
				if !moved && cp != bp && !charged.Before(from) {
					reason := fmt.Sprintf("event time in %s, charged to %s", bp, cp)
					add(PeriodMove, lv, u, cp, -n, reason)
					add(PeriodMove, lv, u, bp, n, reason)
				}
				settle(lv, u, bp)
			}
			if !at.Before(fromDay) {
				for _, u := range quotas(lv, policy.Day) {
					settle(lv, u, period.DayLabel(at))
				}
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("read events to correct: %w", err)
	}
	return out, skipped, nil
}

// driftCorrections compares every monthly counter that the billing log has usage for in
// the open periods with its billable total (asCorrected: see billableCounters). planned adds
// not-yet-applied deltas to the counters read (a dry run); failOpenBefore, when set, leaves
// out fail-open events ingested after it. It returns a restore for each counter below its
// total, and every counter that differs.
func driftCorrections(ctx context.Context, o Options, from time.Time, planned map[string]int64, asCorrected bool, failOpenBefore *time.Time) ([]Adjustment, []Difference, error) {
	counters, err := billableCounters(ctx, o, from, asCorrected, failOpenBefore)
	if err != nil {
		return nil, nil, err
	}

	// One GET per counter, pipelined (keys of several slots: no MGET on a cluster).
	const batch = 500
	for start := 0; start < len(counters); start += batch {
		end := min(start+batch, len(counters))
		pipe := o.Redis.Pipeline()
		cmds := make([]*redis.StringCmd, end-start)
		for i := range cmds {
			cmds[i] = pipe.Get(ctx, counters[start+i].key)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, nil, fmt.Errorf("read counters: %w", err)
		}
		for i, cmd := range cmds {
			v, err := cmd.Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, nil, fmt.Errorf("read counter %s: %w", counters[start+i].key, err)
			}
			counters[start+i].Redis = v + planned[counters[start+i].key]
		}
	}

	var (
		restores []Adjustment
		diffs    []Difference
	)
	for _, c := range counters {
		if c.Redis == c.Billable {
			continue
		}
		diffs = append(diffs, c.Difference)
		if c.Redis < c.Billable {
			restores = append(restores, Adjustment{Kind: DriftRestore, Org: c.Org, Account: c.Account, Level: c.Level,
				Unit: c.Unit, QuotaPeriod: c.QuotaPeriod, Period: c.Period, Amount: c.Billable - c.Redis,
				Reason: fmt.Sprintf("counter %d below billable total %d", c.Redis, c.Billable)})
		}
	}
	return restores, diffs, nil
}

// counter is a quota counter with its billable total (Billable) and, once read, its value.
type counter struct {
	Difference
	key string
}

// billableCounters lists every quota counter of the open periods (months and days) that the
// billing log has usage for, with its billable total.
//
// With asCorrected, the total is what the counter must hold given the corrections recorded
// so far: drift is then only what Redis lost. An outcome or a boundary event metered after
// this run computed its event corrections is left to the next run's refund, settlement or
// move, and is not restored as drift first (which would count it twice).
func billableCounters(ctx context.Context, o Options, from time.Time, asCorrected bool, failOpenBefore *time.Time) ([]counter, error) {
	// asCorrected: an event of a counter that can lose nothing (not fail-open) counts as the
	// corrections recorded so far have left it (moved or not, refunded or not, settled or
	// not); otherwise as billed (event time's month, 5xx nothing, actual units).
	// As in eventCorrections, each event looks its outcome up by key. OFFSET 0 keeps z a
	// subquery evaluated once per event: flattened, its lookups in adjustments are repeated in
	// each of the four sums, or replaced by a hash of every correction of a kind ever recorded.
	rows, err := o.Pool.Query(ctx, `
with x as (
  select e.org, e.path, z.period, date_trunc('day', e.event_time at time zone 'UTC') as day,
         case when z.zero then 0 when z.actual then coalesce(o.requests, e.requests) else e.requests end as requests,
         case when z.zero then 0 when z.actual then coalesce(o.tokens, e.tokens) else e.tokens end as tokens,
         case when z.zero then 0 when z.actual then coalesce(o.credits, e.credits) else e.credits end as credits,
         case when z.zero then 0 when z.actual then coalesce(o.cost_micros, e.cost_micros) else e.cost_micros end as cost_micros
  from usage_events e
  left join lateral (select * from usage_outcomes o where o.event_id = e.event_id limit 1) o on true
  left join usage_voids v on v.event_id = e.event_id
  cross join lateral (select $2::boolean and not e.fail_open as corrected) c
  cross join lateral (select
      case when not c.corrected then coalesce(o.status >= 500, false) or v.event_id is not null
           else exists (select 1 from adjustments a where a.kind in ('refund_5xx', 'refund_void') and a.source_event = e.event_id) end as zero,
      case when not c.corrected then true
           else exists (select 1 from adjustments a where a.kind = 'settle_tokens' and a.source_event = e.event_id) end as actual,
      case when not c.corrected or e.charged_period = e.billing_period
             or exists (select 1 from adjustments a where a.kind = 'period_move' and a.source_event = e.event_id)
           then e.billing_period else e.charged_period end as period
      offset 0) z
  where e.billing_period >= $1 and (not e.fail_open or $4::timestamptz is null or e.ingest_time < $4)
)
select x.org, lvl.account, 'month', x.period::timestamp,
       array[sum(x.requests), sum(x.tokens), sum(x.credits), sum(x.cost_micros)]::bigint[]
from x cross join lateral unnest(x.path) as lvl(account)
where x.period >= $1
group by 1, 2, 3, 4
union all
select x.org, lvl.account, 'day', x.day,
       array[sum(x.requests), sum(x.tokens), sum(x.credits), sum(x.cost_micros)]::bigint[]
from x cross join lateral unnest(x.path) as lvl(account)
where x.day >= $3
group by 1, 2, 3, 4
order by 1, 2, 3, 4`, from, asCorrected, sinceDay(o.Now), failOpenBefore)
	if err != nil {
		return nil, fmt.Errorf("read billable totals: %w", err)
	}
	var counters []counter
	for rows.Next() {
		var (
			org, account string
			window       policy.QuotaPeriod
			period       time.Time
			totals       []int64
		)
		if err := rows.Scan(&org, &account, &window, &period, &totals); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read billable totals: %w", err)
		}
		pol, err := o.Policies.Resolve(account)
		if err != nil {
			continue
		}
		lv := pol.Path[len(pol.Path)-1]
		for _, u := range quotas(lv, window) {
			p := window.Label(period)
			counters = append(counters, counter{
				Difference: Difference{Org: org, Account: account, Level: lv.Kind, Unit: u, QuotaPeriod: window, Period: p, Billable: totals[unitIndex(u)]},
				key:        o.Keys.Quota(org, account, u, p),
			})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read billable totals: %w", err)
	}

	return counters, nil
}

// insert records corrections in one transaction, so an event's corrections are all there
// or none; a correction computed before (a run that died) is the row already there.
func insert(ctx context.Context, o Options, runID uuid.UUID, adj []Adjustment) error {
	if len(adj) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		const chunk = 5000
		for start := 0; start < len(adj); start += chunk {
			part := adj[start:min(start+chunk, len(adj))]
			var kind, org, account, level, unit, window, periods, reason, source []string
			var amount []int64
			for _, a := range part {
				kind = append(kind, string(a.Kind))
				org = append(org, a.Org)
				account = append(account, a.Account)
				level = append(level, string(a.Level))
				unit = append(unit, string(a.Unit))
				start, err := period.Parse(a.Period)
				if err != nil {
					return fmt.Errorf("adjustment of %s: %w", a.Account, err)
				}
				window = append(window, string(policy.KindOf(a.Period)))
				periods = append(periods, start.Format(period.DayLayout))
				amount = append(amount, a.Amount)
				reason = append(reason, a.Reason)
				source = append(source, a.SourceEvent)
			}
			_, err := tx.Exec(ctx, `
insert into adjustments (run_id, kind, org, account, level, unit, quota_period, period, amount, reason, source_event)
select $1, k, o, a, l, u, w, p::date, n, r, nullif(s, '')
from unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[], $10::text[], $11::text[])
  with ordinality as t(k, o, a, l, u, w, p, n, r, s, i)
order by i
on conflict do nothing`, runID, kind, org, account, level, unit, window, periods, amount, reason, source)
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("insert adjustments: %w", err)
	}
	return o.fail(AfterInsert)
}

func pendingRows(ctx context.Context, pool *pgxpool.Pool) ([]Adjustment, error) {
	rows, err := pool.Query(ctx, `
select id, kind, org, account, level, unit, quota_period,
       to_char(period, case quota_period when 'day' then 'YYYY-MM-DD' else 'YYYY-MM' end), amount, reason, coalesce(source_event, '')
from adjustments where applied_at is null order by id`)
	if err != nil {
		return nil, fmt.Errorf("read pending adjustments: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Adjustment, error) {
		var a Adjustment
		err := r.Scan(&a.ID, &a.Kind, &a.Org, &a.Account, &a.Level, &a.Unit, &a.QuotaPeriod, &a.Period, &a.Amount, &a.Reason, &a.SourceEvent)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("read pending adjustments: %w", err)
	}
	return out, nil
}

// apply applies every pending correction, oldest first, and returns how many it marked
// applied. The script's marker makes the Redis change happen once even when a run died
// after it and before the row was marked: the replay returns the values of the first
// application, which are recorded.
func apply(ctx context.Context, o Options, s *Summary) (int, error) {
	pending, err := pendingRows(ctx, o.Pool)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, a := range pending {
		key := o.Keys.Quota(a.Org, a.Account, a.Unit, a.Period)
		got, err := lua.Adjust.Run(ctx, o.Redis, []string{o.Keys.Marker(a.Org, a.ID), key},
			a.Amount, o.MarkerTTL.Milliseconds(), "").Int64Slice()
		if err != nil {
			return n, fmt.Errorf("apply adjustment %d: %w", a.ID, err)
		}
		if len(got) != 3 {
			return n, fmt.Errorf("apply adjustment %d: unexpected reply %v", a.ID, got)
		}
		// A counter created by the correction (e.g. after Redis lost its keys) expires like
		// admission's; an existing one keeps its expiry (NX).
		end, err := period.End(a.Period)
		if err != nil {
			return n, fmt.Errorf("adjustment %d: %w", a.ID, err)
		}
		expire := end.Add(o.CounterRetention)
		if err := o.Redis.Do(ctx, "PEXPIREAT", key, expire.UnixMilli(), "NX").Err(); err != nil {
			return n, fmt.Errorf("expire counter %s: %w", key, err)
		}
		if err := o.fail(AfterRedis); err != nil {
			return n, err
		}
		tag, err := o.Pool.Exec(ctx, `update adjustments set redis_before = $2, redis_after = $3, applied_at = now()
where id = $1 and applied_at is null`, a.ID, got[1], got[2])
		if err != nil {
			return n, fmt.Errorf("mark adjustment %d applied: %w", a.ID, err)
		}
		if tag.RowsAffected() == 1 {
			n++
			s.AdjustmentsApplied++
			s.ByKind[a.Kind]++
		}
		if err := o.fail(AfterMark); err != nil {
			return n, err
		}
	}
	return n, nil
}
