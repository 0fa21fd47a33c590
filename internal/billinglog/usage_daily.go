package billinglog

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed sql/usage_daily.sql
var usageDailySQL string

// Querier runs a query: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// DayUsage is what an account and everything under it used on one UTC day, as the
// billing log bills it (billable_events): its admitted requests (Events, refunded and
// voided ones among them) and the units they bill.
type DayUsage struct {
	Account    string
	Day        time.Time // midnight UTC
	Events     int64
	Requests   int64
	Tokens     int64
	Credits    int64
	CostMicros int64
}

// Daily returns the usage of each of accounts per UTC day of event time, from the day of
// from until before the day of to (their UTC dates: the time of day is ignored), ordered by
// account and day. Days without usage have no row. It reads the rollup usage_daily
// (migration 00028), exact at every commit: a year of an account is at most 366 rows
// whatever its events. A day's sum past int64 (the rollup keeps it) is an error.
func Daily(ctx context.Context, q Querier, accounts []string, from, to time.Time) ([]DayUsage, error) {
	rows, err := q.Query(ctx, usageDailySQL, pgx.StrictNamedArgs{
		"accounts": accounts, "from": utcDate(from), "to": utcDate(to),
	})
	if err != nil {
		return nil, fmt.Errorf("read daily usage: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DayUsage, error) {
		var d DayUsage
		err := r.Scan(&d.Account, &d.Day, &d.Events, &d.Requests, &d.Tokens, &d.Credits, &d.CostMicros)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read daily usage: %w", err)
	}
	return out, nil
}

// utcDate is t's UTC date as "YYYY-MM-DD", for a date parameter (pgx would take a
// time.Time's date in its own location).
func utcDate(t time.Time) string { return t.UTC().Format(time.DateOnly) }
