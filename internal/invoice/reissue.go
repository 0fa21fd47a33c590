package invoice

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrAlreadyReissued is returned by Reissue for a voided invoice that a reissue replaces
// already.
var ErrAlreadyReissued = errors.New("invoice already reissued")

//go:embed sql/billed_late_units.sql
var billedLateUnitsSQL string

// Reissue issues the replacement of voided invoice id, for reason, by by: a new invoice
// (the next number) for the same org and period, computed from the billing log as it is
// now, as the period's close would compute it today (the events the close covered with
// today's outcomes, amendments and credits, the late events and corrections of earlier
// periods not billed yet, the customer's billing details and tax rate now), plus
// adjustment lines for its own period that bring what live invoices billed for it back to
// what it bills: the later invoices' late and adjustment lines for the period stay where
// they are, and were priced against the voided invoice. It records invoice.issued.v1.
// Errors: ErrNotFound, ErrTransition (the invoice is not void), ErrAlreadyReissued,
// ErrInvalidReason; an error pricing it (ErrCurrencyMismatch, ErrOverflow) writes nothing.
func Reissue(ctx context.Context, pool *pgxpool.Pool, is Issuer, id int64, reason, by string, now time.Time) (Invoice, error) {
	if err := checkReason(reason); err != nil {
		return Invoice{}, err
	}
	if err := is.Validate(); err != nil {
		return Invoice{}, fmt.Errorf("issuer: %w", err)
	}
	var out Invoice
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Ordered with closes: both bill late events and corrections.
		if err := lockCloses(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `select 1 from invoices where id = $1 for update`, id); err != nil {
			return fmt.Errorf("lock invoice %d: %w", id, err)
		}
		orig, err := Get(ctx, tx, id)
		if err != nil {
			return err
		}
		if orig.Status != StatusVoid {
			return fmt.Errorf("invoice %d is %s, not void: void it first: %w", id, orig.Status, ErrTransition)
		}
		var replacedBy *string
		if err := tx.QueryRow(ctx, `select min(coalesce(number, id::text)) from invoices where replaces = $1`, id).Scan(&replacedBy); err != nil {
			return fmt.Errorf("read reissues of invoice %d: %w", id, err)
		}
		if replacedBy != nil {
			return fmt.Errorf("invoice %d is replaced by %s: %w", id, *replacedBy, ErrAlreadyReissued)
		}
		month, err := time.Parse(dateLayout, orig.Period)
		if err != nil {
			return fmt.Errorf("invoice %d's period %q: %w", id, orig.Period, err)
		}
		var closedAt time.Time
		if err := tx.QueryRow(ctx, `select closed_at from periods where period = $1`, month).Scan(&closedAt); err != nil {
			return fmt.Errorf("read the close of %s: %w", orig.Period, err)
		}
		iss, err := loadIssue(ctx, tx, month, month.AddDate(0, 1, 0), closedAt, []string{orig.Org})
		if err != nil {
			return err
		}
		// Microseconds, as PostgreSQL keeps it: the event says what the row says.
		iss.issuer, iss.by, iss.issuedAt, iss.replaces, iss.reason = is, by, now.Truncate(time.Microsecond), &orig, reason
		if iss.details, err = readBillingDetails(ctx, tx, iss.orgs); err != nil {
			return err
		}
		if err := iss.blocked(orig.Org); err != nil {
			return err
		}
		d, err := iss.price(ctx, tx, orig.Org)
		if err != nil {
			return err
		}
		if iss.seq, err = lockSequence(ctx, tx, is, seqInvoice, iss.issuedAt); err != nil {
			return err
		}
		inv, e, err := iss.writeInvoice(ctx, tx, d)
		if err != nil {
			return err
		}
		iss.seq.take()
		if err := errors.Join(recordEvents(ctx, tx, e), iss.seq.save(ctx, tx)); err != nil {
			return err
		}
		out, err = Get(ctx, tx, inv.ID)
		return err
	})
	if err != nil {
		return Invoice{}, fmt.Errorf("reissue invoice %d: %w", id, err)
	}
	return out, nil
}

// reissueCorrections are the adjustment (and credits_applied) lines of a reissue for its
// own period: lines are its lines so far, whose usage, credits_applied and priced lines
// bill the events the period's close covered, as they bill now. Other live invoices billed
// for the period too (late lines, and adjustments priced against the voided invoice):
// with U units in lines, covered Cov, priced M, others billed Qo units, covered Co, for
// Ao, and the late events they billed bill Lb now, covered Lc, the period bills U + Lb,
// covered Cov + Lc, for price(U + Lb − Cov − Lc): the difference is a correction
// (priceCorrection) from billed U + Qo, covered Cov + Co, for M + Ao.
func (is *issuance) reissueCorrections(ctx context.Context, tx pgx.Tx, plan Plan, org string, lines []Line) ([]Line, error) {
	type sums struct{ usage, covered, amount int64 }
	own := map[string]*sums{}
	for _, l := range lines {
		if l.Unit == "" || l.ForPeriod != "" {
			continue
		}
		s := own[l.Unit]
		if s == nil {
			s = &sums{}
			own[l.Unit] = s
		}
		switch l.Kind {
		case KindUsage:
			s.usage += l.Quantity
		case KindCreditsApplied:
			s.covered += l.Quantity
		case KindIncluded, KindOverageTier:
			s.amount += l.AmountMinor
		}
	}
	rows, err := tx.Query(ctx, billedLateUnitsSQL, pgx.StrictNamedArgs{"org": org, "period": is.period})
	if err != nil {
		return nil, fmt.Errorf("read billed late units: %w", err)
	}
	late := map[string][2]int64{}
	for rows.Next() {
		var unit string
		var billable, covered int64
		if err := rows.Scan(&unit, &billable, &covered); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read billed late units: %w", err)
		}
		late[unit] = [2]int64{billable, covered}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read billed late units: %w", err)
	}
	var out []Line
	for _, u := range units {
		var b billedUnits
		if err := tx.QueryRow(ctx, billedUnitsSQL, pgx.StrictNamedArgs{"org": org, "period": is.period, "unit": u}).
			Scan(&b.quantity, &b.covered, &b.amount); err != nil {
			return nil, fmt.Errorf("read billed units: %w", err)
		}
		s := own[u]
		if s == nil {
			s = &sums{}
		}
		c := correction{
			org: org, plan: plan.ID, version: plan.Version, unit: u, period: is.period,
			billed: s.usage + b.quantity, billable: s.usage + late[u][0],
			billedCovered: s.covered + b.covered, covered: s.covered + late[u][1],
			billedAmount: s.amount + b.amount,
		}
		l, err := priceCorrection(is.pr, plan, c)
		if err != nil {
			return nil, fmt.Errorf("reissue of org %s: %w", org, err)
		}
		out = append(out, l...)
	}
	return out, nil
}
