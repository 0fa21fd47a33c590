package admission

import (
	"context"
	"errors"
	"time"

	"github.com/metergate/metergate/internal/policy"
)

// Idempotency for a day at bounded memory (docs/admission.md, "Idempotency"): Redis holds
// each record exactly for a short hot window, and a Bloom filter per shard and half-window
// of every key admitted; a key the hot window misses and a filter may hold is looked up in
// the billing log (IdempotencyLog). The hot window is never shorter than the pipeline's
// backlog: a shard's records stay in Redis until its mark (keyspace.Keys.IdempotencyMark) says their
// events are in the log.

// IdempotencyLog answers for idempotency keys older than the hot window: the billing log.
type IdempotencyLog interface {
	// First returns the first admission recorded under key for account at or after since
	// that was not voided; ok is false when there is none.
	First(ctx context.Context, account, key string, since time.Time) (a LoggedAdmission, ok bool, err error)
}

// LoggedAdmission is an admission as the billing log holds it.
type LoggedAdmission struct {
	EventID string
	Period  string // the quota period charged, "YYYY-MM"
	Units   map[policy.Unit]int64
	Tool    string
}

// ErrIdempotencyUnverifiable is returned when a request's idempotency key may have been
// used before the hot window and the billing log cannot be read: the request is refused
// (503) rather than risk charging a retry twice.
var ErrIdempotencyUnverifiable = errors.New("idempotency key cannot be checked against the billing log")
