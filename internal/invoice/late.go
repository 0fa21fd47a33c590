package invoice

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/period"
)

// The statements that read the late events and corrections a close bills, and what was
// billed before them.
var (
	//go:embed sql/late_events.sql
	lateEventsSQL string
	//go:embed sql/billed_units.sql
	billedUnitsSQL string
	//go:embed sql/corrections.sql
	correctionsSQL string
	//go:embed sql/changed_periods.sql
	changedPeriodsSQL string
)

// lateEvent is a late event to bill: of a closed period, not billed yet.
type lateEvent struct {
	eventID string
	period  time.Time
	org     string
	path    string
	units   map[string]int64
	covered map[string]int64 // of units, what the org's own credit grants covered
}

// loadLate reads the late events not billed yet of the closed periods before period: events
// flagged late by the meter, or ingested after their period's close.
func loadLate(ctx context.Context, tx pgx.Tx, period time.Time) ([]lateEvent, error) {
	rows, err := tx.Query(ctx, lateEventsSQL, pgx.StrictNamedArgs{"period": period})
	if err != nil {
		return nil, fmt.Errorf("read late events: %w", err)
	}
	defer rows.Close()
	var out []lateEvent
	for rows.Next() {
		var e lateEvent
		var q, c [4]int64
		if err := rows.Scan(&e.eventID, &e.period, &e.org, &e.path, &q[0], &q[1], &q[2], &q[3], &c[0], &c[1], &c[2], &c[3]); err != nil {
			return nil, fmt.Errorf("read late events: %w", err)
		}
		e.units, e.covered = map[string]int64{}, map[string]int64{}
		for i, u := range units {
			e.units[u], e.covered[u] = q[i], c[i]
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read late events: %w", err)
	}
	return out, nil
}

// billedUnits is what live invoices billed for a closed period and unit so far: units
// (usage, late and adjustment lines), of them the units credits covered (credits_applied
// lines), and the amount of the priced lines. The tiers priced quantity − covered: amount
// is price(quantity − covered) unless a void took lines out of the middle of the period's
// billing, and the next lines priced for the period make it so again.
type billedUnits struct {
	quantity, covered, amount int64
}

// priceLate prices late events at the margin of the period they belong to: with B units
// already billed for that period (its invoice's usage lines and earlier late lines), Cb of
// them covered by credits, for an amount A (= price(B−Cb) unless a void broke it), and L
// late ones of which the org's credits covered C, they cost price(B−Cb+L−C) − A, under the plan of that period's invoice and the price
// version it was priced with (the current plan if the org had none). One late line per
// period, account path and unit, each the margin over the lines before it, so the lines add
// up to the exact margin; each followed by a credits_applied line (amount 0) of its C when
// C > 0.
func priceLate(ctx context.Context, tx pgx.Tx, pr prices, current Plan, org string, events []lateEvent, billed map[[2]string]billedUnits) ([]Line, error) {
	type key struct {
		period time.Time
		path   string
		unit   string
	}
	qty, cov := map[key]int64{}, map[key]int64{}
	var keys []key
	for _, e := range events {
		for _, u := range units {
			if e.units[u] == 0 {
				continue
			}
			k := key{e.period, e.path, u}
			if _, ok := qty[k]; !ok {
				keys = append(keys, k)
			}
			if qty[k] > math.MaxInt64-e.units[u] {
				return nil, fmt.Errorf("late %s of %s: total past the largest quantity %d (bigint)", u, e.period.Format("2006-01"), int64(math.MaxInt64))
			}
			qty[k] += e.units[u]
			cov[k] += min(e.covered[u], e.units[u]) // at most qty[k]: no overflow
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if !a.period.Equal(b.period) {
			return a.period.Before(b.period)
		}
		if a.unit != b.unit {
			return a.unit < b.unit
		}
		return a.path < b.path
	})
	// billed: (period, unit) → units billed so far, when a correction set it already.
	var lines []Line
	for _, k := range keys {
		pk := [2]string{k.period.Format(dateLayout), k.unit}
		plan, err := pricedWith(ctx, tx, pr, current, org, k.period)
		if err != nil {
			return nil, err
		}
		if plan.Currency != current.Currency {
			return nil, fmt.Errorf("late units of %s were priced in %s, the invoice is in %s", pk[0], plan.Currency, current.Currency)
		}
		var up *UnitPrice
		for i := range plan.Units {
			if plan.Units[i].Unit == k.unit {
				up = &plan.Units[i]
			}
		}
		if up == nil {
			continue // a unit the plan does not bill
		}
		if _, ok := billed[pk]; !ok {
			var b billedUnits
			if err := tx.QueryRow(ctx, billedUnitsSQL, pgx.StrictNamedArgs{"org": org, "period": k.period, "unit": k.unit}).
				Scan(&b.quantity, &b.covered, &b.amount); err != nil {
				return nil, fmt.Errorf("read billed units: %w", err)
			}
			billed[pk] = b
		}
		b := billed[pk]
		after, err := up.Amount(b.quantity - b.covered + qty[k] - cov[k])
		if err != nil {
			return nil, err
		}
		billed[pk] = billedUnits{quantity: b.quantity + qty[k], covered: b.covered + cov[k], amount: after}
		lines = append(lines, Line{Kind: KindLate, AccountPath: k.path, Unit: k.unit, Quantity: qty[k],
			PerUnits: 1, AmountMinor: after - b.amount, ForPeriod: pk[0]})
		if cov[k] > 0 {
			lines = append(lines, Line{Kind: KindCreditsApplied, AccountPath: k.path, Unit: k.unit, Quantity: cov[k],
				PerUnits: 1, ForPeriod: pk[0]})
		}
	}
	return lines, nil
}

// pricedWith is the price version org's live invoice for the closed period p was priced
// with, or current when the org has none for p.
func pricedWith(ctx context.Context, tx pgx.Tx, pr prices, current Plan, org string, p time.Time) (Plan, error) {
	var priced priceKey
	err := tx.QueryRow(ctx, `select plan, price_version from invoices where org = $1 and period = $2 and status <> 'void' order by id desc limit 1`,
		org, p).Scan(&priced.plan, &priced.version)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return current, nil
	case err != nil:
		return Plan{}, fmt.Errorf("read invoice plan: %w", err)
	}
	plan, err := pr.version(priced)
	if err != nil {
		return Plan{}, fmt.Errorf("the %s invoice: %w", p.Format(dateLayout), err)
	}
	return plan, nil
}

// correctionWindow is how many closed months before its own a close always looks at for
// usage whose billing changed after their close (outcomes reported late: a 5xx refunds,
// actual tokens settle). Older months are looked at when something of theirs changed
// since the previous close (changedPeriods).
const correctionWindow = 3

// correction is a change, since it was invoiced, of what an org's units of a closed
// period bill.
type correction struct {
	org, plan, unit  string
	version          int // the price version of the period's invoice
	period           time.Time
	billed, billable int64
	// billedCovered is what credits_applied lines for the period said credits covered;
	// covered is what the org's credits cover of the period's billed events now.
	billedCovered, covered int64
	billedAmount           int64 // what the live invoices' priced lines for the period add up to
	// err is why the org's numbers for the period cannot be billed (a sum past bigint):
	// that org fails, the others do not.
	err error
}

// scanCorrection reads a row of corrections.sql or period_corrections.sql for month: the
// sums come as text and are parsed here (parseSum), so that one org's sum past bigint is
// its correction's err, not an error of the query for every org.
func scanCorrection(r pgx.CollectableRow, month time.Time) (correction, error) {
	c := correction{period: month}
	var raw [5]string
	if err := r.Scan(&c.org, &c.plan, &c.version, &c.unit, &raw[0], &raw[1], &raw[2], &raw[3], &raw[4]); err != nil {
		return correction{}, err
	}
	for i, v := range []*int64{&c.billed, &c.billable, &c.billedCovered, &c.covered, &c.billedAmount} {
		n, err := parseSum(raw[i])
		if err != nil && c.err == nil {
			c.err = fmt.Errorf("%s of %s: %w", c.unit, month.Format("2006-01"), err)
		}
		*v = n
	}
	return c, nil
}

// loadCorrections reads, for the closed periods of the correctionWindow months before
// period and the older ones that changed since the previous close (changedPeriods), every
// (org, period, unit) whose billed units differ from its billable units now, whose credits
// applied differ from what the org's credits cover now, or whose amount billed is not the
// price of what was billed (finance_period_billing).
func loadCorrections(ctx context.Context, tx pgx.Tx, period time.Time) ([]correction, error) {
	months, err := changedPeriods(ctx, tx, period)
	if err != nil {
		return nil, err
	}
	for m := correctionWindow; m >= 1; m-- {
		months = append(months, period.AddDate(0, -m, 0))
	}
	var out []correction
	for _, month := range months {
		// One period per query: the equality reaches into the view's grouped subqueries.
		rows, err := tx.Query(ctx, correctionsSQL, pgx.StrictNamedArgs{"period": month})
		if err != nil {
			return nil, fmt.Errorf("read corrections: %w", err)
		}
		cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (correction, error) { return scanCorrection(r, month) })
		if err != nil {
			return nil, fmt.Errorf("read corrections: %w", err)
		}
		out = append(out, cs...)
	}
	return out, nil
}

// changedPeriods lists, oldest first, the closed periods older than the correction window
// before period whose billing changed since the previous close (the last closed_at of a
// period before it): an outcome or void of their events ingested since, an amendment, an
// invoice voided. None when no period before it is closed.
func changedPeriods(ctx context.Context, tx pgx.Tx, period time.Time) ([]time.Time, error) {
	var since *time.Time
	if err := tx.QueryRow(ctx, `select max(closed_at) from periods where period < $1`, period).Scan(&since); err != nil {
		return nil, fmt.Errorf("read the previous close: %w", err)
	}
	if since == nil {
		return nil, nil
	}
	rows, err := tx.Query(ctx, changedPeriodsSQL, pgx.StrictNamedArgs{"since": *since, "before": period.AddDate(0, -correctionWindow, 0)})
	if err != nil {
		return nil, fmt.Errorf("read changed periods: %w", err)
	}
	months, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return nil, fmt.Errorf("read changed periods: %w", err)
	}
	return months, nil
}

// priceCorrection prices the change from billed to billable units of a closed period at its
// margin, under that period's invoice's plan and price version: price(billable − covered) −
// the amount billed (price(billed − billed covered) unless a void broke it), negative for a
// refund, as an adjustment line (left out when both its quantity and amount are 0), then a credits_applied line (amount 0) of the
// change in covered units when there is one. nil when the plan does not bill the unit.
func priceCorrection(pr prices, current Plan, c correction) ([]Line, error) {
	plan, err := pr.version(priceKey{c.plan, c.version})
	if err != nil {
		return nil, fmt.Errorf("the %s invoice: %w", period.MonthLabel(c.period), err)
	}
	if plan.Currency != current.Currency {
		return nil, fmt.Errorf("units of %s were priced in %s, the invoice is in %s", period.MonthLabel(c.period), plan.Currency, current.Currency)
	}
	for _, up := range plan.Units {
		if up.Unit != c.unit {
			continue
		}
		before := c.billedAmount
		after, err := up.Amount(c.billable - c.covered)
		if err != nil {
			return nil, err
		}
		var lines []Line
		if c.billable != c.billed || after != before {
			lines = append(lines, Line{Kind: KindAdjustment, AccountPath: c.org, Unit: c.unit, Quantity: c.billable - c.billed,
				PerUnits: 1, AmountMinor: after - before, ForPeriod: c.period.Format(dateLayout)})
		}
		if c.covered != c.billedCovered {
			lines = append(lines, Line{Kind: KindCreditsApplied, AccountPath: c.org, Unit: c.unit, Quantity: c.covered - c.billedCovered,
				PerUnits: 1, ForPeriod: c.period.Format(dateLayout)})
		}
		return lines, nil
	}
	return nil, nil
}
