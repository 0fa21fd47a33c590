package invoice

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/period"
)

// DefaultGrace is how long after a period's end Close waits, unless told otherwise: long
// enough for the pipeline to drain and reconcile to settle the month.
const DefaultGrace = 3 * 24 * time.Hour

var (
	// ErrTooEarly is returned by Close before the period's end plus the grace (without Force).
	ErrTooEarly = errors.New("period not over yet (end + grace)")
	// ErrLaterPeriodClosed is returned by Close for a period older than a closed one: late
	// events would otherwise be billed on an earlier invoice than the one they follow.
	ErrLaterPeriodClosed = errors.New("a later period is already closed")
	// ErrNotFound is returned for an invoice, credit note or billing details that do not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvoicesFailed is returned by Close, with its Result, when some orgs' invoices
	// could not be issued (Result.Failed): the others are issued and the period is closed;
	// a close of the period again retries the failed ones.
	ErrInvoicesFailed = errors.New("some orgs' invoices could not be issued")
)

// Options tunes Close. The zero value closes a period that ended more than DefaultGrace ago.
type Options struct {
	Clock period.Clock  // nil: the system clock
	Grace time.Duration // after the period's end; zero = DefaultGrace
	Force bool          // close even before the end plus the grace
	By    string        // who closes, recorded in periods.closed_by; empty = "invoice.Close"
	Log   *slog.Logger  // where each org's failed invoice is logged; nil: nowhere
	// Issuer is who issues the invoices: the seller's details, the numbers' prefix, the
	// tax rates and the payment terms.
	Issuer Issuer
}

// Result is what Close did.
type Result struct {
	Period   time.Time
	ClosedAt time.Time
	Created  bool // true: this call closed the period; false: it was closed already
	// Issued counts the invoices this call issued: every due org's when it closed the
	// period, the retried ones when it was closed already (0: nothing was written).
	Issued   int
	Invoices []Invoice // every invoice of the period
	// Failed lists the orgs whose invoice this call could not issue (empty when none).
	Failed []Failure
}

// Failure is an org whose invoice a close could not issue: its invoice was rolled back
// alone, recorded in invoice_failures, and is retried by a close of the period again.
type Failure struct {
	Org    string `json:"org"`
	Period string `json:"period"` // YYYY-MM
	Error  string `json:"error"`
}

// dateLayout is how a period's first day is keyed (as PostgreSQL's date).
const dateLayout = period.DayLayout

// LastClosable is the last month whose end plus the grace (zero: DefaultGrace) has passed at
// now: the month a monthly close job closes.
func LastClosable(now time.Time, grace time.Duration) time.Time {
	if grace == 0 {
		grace = DefaultGrace
	}
	return period.MonthStart(now.Add(-grace)).AddDate(0, -1, 0)
}

// Close freezes a billing period and issues one invoice per org: the orgs with usage in
// the period, with unbilled late events of earlier closed periods, or on a plan with a base
// fee. It runs in one transaction, serialized with other closes by an advisory lock, and
// each org's invoice is written under a savepoint of its own: an org whose invoice cannot
// be priced or written (a total past bigint, a price that does not validate, any error of
// its own) is rolled back alone, recorded in invoice_failures and returned in
// Result.Failed with ErrInvoicesFailed; every other org's invoice is issued and the period
// is closed.
//
// Closing a closed period again retries its open failures (orgs with a failure and still
// no invoice), each issued at most once (invoices are unique per org and period), and
// otherwise writes nothing and returns its invoices. An org with an open failure of an
// earlier period is not invoiced for a later one (it fails, naming that period), so its
// invoices are issued in order once its data is fixed.
func Close(ctx context.Context, pool *pgxpool.Pool, month time.Time, opts Options) (Result, error) {
	month = period.MonthStart(month)
	end := month.AddDate(0, 1, 0)
	now, grace, by, log := opts.Clock.Now(), opts.Grace, opts.By, opts.Log
	if grace == 0 {
		grace = DefaultGrace
	}
	if by == "" {
		by = "invoice.Close"
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := opts.Issuer.Validate(); err != nil {
		return Result{}, fmt.Errorf("close %s: issuer: %w", period.MonthLabel(month), err)
	}
	if !opts.Force && now.Before(end.Add(grace)) {
		return Result{}, fmt.Errorf("close %s before %s: %w", period.MonthLabel(month), end.Add(grace).Format(time.RFC3339), ErrTooEarly)
	}
	var res Result
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res = Result{Period: month, Failed: []Failure{}}
		if err := lockCloses(ctx, tx); err != nil {
			return err
		}
		var closedAt *time.Time
		var later bool
		if err := tx.QueryRow(ctx, periodStateSQL, pgx.StrictNamedArgs{"period": month}).Scan(&closedAt, &later); err != nil {
			return fmt.Errorf("read periods: %w", err)
		}
		var only []string // nil: every org due an invoice
		if closedAt != nil {
			res.ClosedAt = *closedAt
			open, err := openFailures(ctx, tx, month)
			if err != nil {
				return err
			}
			if len(open) == 0 {
				invs, err := loadInvoices(ctx, tx, month)
				res.Invoices = invs
				return err
			}
			only = open
		} else {
			if later {
				return fmt.Errorf("close %s: %w", period.MonthLabel(month), ErrLaterPeriodClosed)
			}
			if err := lockPartition(ctx, tx, month); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `insert into periods (period, closed_at, closed_by) values ($1, clock_timestamp(), $2) returning closed_at`,
				month, by).Scan(&res.ClosedAt); err != nil {
				return fmt.Errorf("insert period: %w", err)
			}
			res.Created = true
		}
		issued, failed, err := issue(ctx, tx, opts.Issuer, by, month, end, res.ClosedAt, only)
		if err != nil {
			return err
		}
		res.Issued = issued
		for _, f := range failed {
			if _, err := tx.Exec(ctx, `insert into invoice_failures (period, org, error) values ($1, $2, $3)`, month, f.Org, f.Error); err != nil {
				return fmt.Errorf("record the failed invoice of org %s: %w", f.Org, err)
			}
			res.Failed = append(res.Failed, f)
		}
		invs, err := loadInvoices(ctx, tx, month)
		res.Invoices = invs
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("close period %s: %w", period.MonthLabel(month), err)
	}
	for _, f := range res.Failed {
		log.Error("invoice not issued", "org", f.Org, "period", f.Period, "err", f.Error)
	}
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("close period %s: %d orgs: %w", period.MonthLabel(month), len(res.Failed), ErrInvoicesFailed)
	}
	return res, nil
}

// The statements of the close itself; the invoices' are in issue.go and late.go.
var (
	//go:embed sql/period_state.sql
	periodStateSQL string
	//go:embed sql/usage_partition.sql
	usagePartitionSQL string
	//go:embed sql/open_failures.sql
	openFailuresSQL string
	//go:embed sql/earlier_failures.sql
	earlierFailuresSQL string
)

// lockCloses takes, for tx, the lock that orders everything that bills late events and
// corrections or changes what a period bills: closes, reissues and amendments.
func lockCloses(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('metergate.invoice.close'))`); err != nil {
		return fmt.Errorf("lock close: %w", err)
	}
	return nil
}

// lockPartition waits for the meter's transactions writing month, and keeps new ones out
// until the close commits: what the invoices read is then exactly what was ingested by
// closed_at. Later rows are late.
func lockPartition(ctx context.Context, tx pgx.Tx, month time.Time) error {
	var part pgx.Identifier
	err := tx.QueryRow(ctx, usagePartitionSQL, pgx.StrictNamedArgs{"period": month}).Scan(&part)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // no partition: no usage, nothing to wait for
	case err != nil:
		return fmt.Errorf("find partition: %w", err)
	default:
		if _, err := tx.Exec(ctx, "lock table "+part.Sanitize()+" in share mode"); err != nil {
			return fmt.Errorf("lock partition %s: %w", part.Sanitize(), err)
		}
	}
	return nil
}

// openFailures lists the orgs with a failed invoice for month and still no invoice.
func openFailures(ctx context.Context, tx pgx.Tx, month time.Time) ([]string, error) {
	rows, err := tx.Query(ctx, openFailuresSQL, pgx.StrictNamedArgs{"period": month})
	if err != nil {
		return nil, fmt.Errorf("read failed invoices: %w", err)
	}
	orgs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read failed invoices: %w", err)
	}
	return orgs, nil
}

// earlierFailures maps each org with an open failure of a period before month to the
// first such period.
func earlierFailures(ctx context.Context, tx pgx.Tx, month time.Time) (map[string]time.Time, error) {
	rows, err := tx.Query(ctx, earlierFailuresSQL, pgx.StrictNamedArgs{"period": month})
	if err != nil {
		return nil, fmt.Errorf("read earlier failed invoices: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var org string
		var p time.Time
		if err := rows.Scan(&org, &p); err != nil {
			return nil, fmt.Errorf("read earlier failed invoices: %w", err)
		}
		out[org] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read earlier failed invoices: %w", err)
	}
	return out, nil
}
