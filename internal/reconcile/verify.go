package reconcile

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/policy"
)

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

//go:embed sql/misapplied_adjustments.sql
var misappliedAdjustmentsSQL string

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
	rows, err := o.Pool.Query(ctx, misappliedAdjustmentsSQL, pgx.StrictNamedArgs{"run_id": runID})
	if err != nil {
		return nil, fmt.Errorf("check applied adjustments: %w", err)
	}
	bad, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("check applied adjustments: %w", err)
	}
	failures = append(failures, bad...)
	// A counter it cannot compare is a problem the run's drift pass reported already.
	_, diffs, _, err := driftCorrections(ctx, o, from, nil, true, &cutoff)
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
//
// A counter it cannot compare (a value that is not an integer within ±keyspace.MaxCounter,
// a billable total past it) is returned as a problem, logged, and every other counter is
// still compared; the error is then nil: the caller decides (cmd/reconcile exits 1).
func Verify(ctx context.Context, o Options) ([]Difference, []Problem, error) {
	if err := o.defaults(); err != nil {
		return nil, nil, err
	}
	from := since(o.now)
	_, diffs, problems, err := driftCorrections(ctx, o, from, nil, false, nil)
	if err != nil {
		return nil, nil, err
	}
	// Counters of accounts without any usage in the log (events lost on the way, or
	// counters no event explains) are found by scanning Redis.
	checked := map[string]bool{}
	totals, err := billableCounters(ctx, o, from, false, nil)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range totals {
		checked[c.key] = true
	}
	stray, strayProblems, err := strayCounters(ctx, o, from, checked)
	if err != nil {
		return nil, nil, err
	}
	problems = append(problems, strayProblems...)
	for _, p := range problems {
		o.Log.Warn("verify skipped an account's bad data", p.attrs()...)
	}
	return append(diffs, stray...), problems, nil
}
