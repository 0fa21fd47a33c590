// Package billinglog reads the billing log (PostgreSQL's usage_events) for admission: the
// first admission of an idempotency key older than Redis' hot window (docs/admission.md,
// "Idempotency"). Its Log is admission.Options.IdempotencyLog in admit.
package billinglog

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

//go:embed sql/first.sql
var firstSQL string

// DefaultTimeout bounds one lookup: a request waits for it, and a log that cannot answer
// in time is answered 503 (admission.ErrIdempotencyUnverifiable) rather than guessed.
const DefaultTimeout = time.Second

// lookAhead is how far past the reader's clock a first admission's event time may lie and
// still be found: Redis TIME stamps events, and admit's clock picks the partitions, so a
// month boundary between the two clocks must not hide a partition.
const lookAhead = time.Hour

// Options configure a Log. Zero values take the defaults named.
type Options struct {
	// Timeout bounds one lookup (DefaultTimeout).
	Timeout time.Duration
	// Clock picks the newest billing period looked in (nil: the system clock).
	Clock period.Clock
}

// Log answers admission's lookups of idempotency keys from usage_events.
type Log struct {
	pool *pgxpool.Pool
	opts Options
}

var _ admission.IdempotencyLog = (*Log)(nil)

// New returns a Log reading through pool (the services' role: it only reads).
func New(pool *pgxpool.Pool, o Options) *Log {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return &Log{pool: pool, opts: o}
}

// First returns the first admission recorded under key for account at or after since that
// was not voided; ok is false when there is none. It looks in the billing periods from
// since's to the current one: two partitions for a TTL of a day.
func (l *Log) First(ctx context.Context, account, key string, since time.Time) (admission.LoggedAdmission, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	last := l.opts.Clock.Now()
	if last.Before(since) {
		last = since
	}
	var (
		a                                 admission.LoggedAdmission
		charged                           time.Time
		requests, tokens, credits, micros int64
	)
	err := l.pool.QueryRow(ctx, firstSQL, pgx.StrictNamedArgs{
		"account": account, "key": key, "since": since,
		"first_period": period.MonthStart(since), "last_period": period.MonthStart(last.Add(lookAhead)),
	}).Scan(&a.EventID, &charged, &requests, &tokens, &credits, &micros, &a.Tool)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return admission.LoggedAdmission{}, false, nil
	case err != nil:
		return admission.LoggedAdmission{}, false, fmt.Errorf("look up idempotency key in the billing log: %w", err)
	}
	a.Period = period.MonthLabel(charged)
	a.Units = make(map[policy.Unit]int64, 4)
	for u, n := range map[policy.Unit]int64{policy.Requests: requests, policy.Tokens: tokens, policy.Credits: credits, policy.CostMicros: micros} {
		if n != 0 { // a unit of 0 is not told apart from a unit not sent
			a.Units[u] = n
		}
	}
	return a, true, nil
}
