// Package admission decides whether a request may proceed against every limit of every
// level of its account path, in one Redis script call: token buckets or sliding windows per
// unit, concurrency leases and quotas, all-or-nothing, with the idempotency record and the
// outbox event written by the same script.
package admission

import (
	"errors"
	"time"

	"github.com/metergate/metergate/internal/policy"
)

// Request is one decision to take.
type Request struct {
	// EventID identifies the usage event if the request is admitted; NewEventID makes one.
	EventID string
	// IdempotencyKey, when set, makes a retry return the first decision and charge nothing.
	IdempotencyKey string
	// Units is what the request would consume; every value ≥ 0.
	Units map[policy.Unit]int64
	// Policy is the effective policy of the account the request is charged to.
	Policy   policy.Resolved
	APIKeyID string
	Tool     string
	// Source names the admit node (the CloudEvents source).
	Source string
	// MaxWait, when positive, lets a request refused by a rate or concurrency limit wait
	// in that limit's queue, in Redis, for up to this long (Admitter.Decide).
	MaxWait time.Duration
	// Shadow admits the request even when a limit refuses it (shadow mode): the refusal is
	// reported in Decision.Shadow and in the usage event, the request takes no rate
	// capacity and is billed (docs/admission.md, "Shadow mode"). A shadow request does not
	// wait.
	Shadow bool
	// RefuseReplay refuses a replay of the idempotency key (a *ReplayError) instead of
	// answering it with the first decision: a gateway would serve the request again, and a
	// replay charges nothing. A refused replay is not an attempt of the decision.
	RefuseReplay bool
}

// Result is the outcome of a decision.
type Result string

// Results.
const (
	Allow         Result = "allow"
	RateLimited   Result = "rate_limited"
	QuotaExceeded Result = "quota_exceeded"
	// InsufficientBalance: an account of the path has credit grants of a unit the request
	// carries, and their balance does not cover it (docs/credits.md).
	InsufficientBalance Result = "insufficient_balance"
)

// ConcurrentRequests is the unit named by a decision blocked by a concurrency cap.
const ConcurrentRequests = "concurrent-requests"

// Blocker names the limit that denied a request.
type Blocker struct {
	Account string      `json:"account"`
	Level   policy.Kind `json:"level"`
	Unit    string      `json:"unit"`
}

// LimitState is where one limit stands after a decision, for the RateLimit fields.
type LimitState struct {
	Account   string
	Unit      string
	Quota     bool          // a quota (true) or a rate limit (false)
	Limit     int64         // bucket burst, window limit or quota
	Window    time.Duration // time for an empty bucket to fill, the window, or the quota period
	Remaining int64
	Reset     time.Duration // until the limit is whole again (bucket full, window clear, period end)
	// Ceiling is what a token bucket with a guarantee may reach by borrowing, per Window of
	// its guarantee (0: no ceiling).
	Ceiling int64
}

// Balance is an account's credit balance of a unit: its grants drawable now.
type Balance struct {
	Account string
	Unit    string
	Balance int64
}

// Decision is the answer to a Request.
type Decision struct {
	Result     Result
	EventID    string // of the admitted (or replayed) request
	Period     string // billing period charged, "YYYY-MM", chosen by Redis TIME
	Blocked    *Blocker
	RetryAfter time.Duration // when denied by a rate or concurrency limit
	Replayed   bool          // the idempotency key was seen: nothing was charged now
	Limits     []LimitState
	// Balances are the credit balances the request draws from: after the draw when
	// allowed, as found when refused (-1: not read, the request was refused before).
	Balances []Balance
	Time     time.Time // Redis time of the decision
	// Shadow is, for a request in shadow mode that was admitted, the refusal it would have
	// had; nil when nothing would have refused it.
	Shadow *Shadow
	// place is where a refused request that may wait stands in its limit's queue.
	place place
}

// Shadow is a refusal shadow mode let pass: what, and which limit.
type Shadow struct {
	Result     Result
	Blocked    *Blocker
	RetryAfter time.Duration // a rate limit's
}

// ErrIdempotencyKeyReused is returned when an idempotency key comes back with other units
// or another tool.
var ErrIdempotencyKeyReused = errors.New("idempotency key reused with different units")

// ErrIdempotencyKeyExhausted is returned for a replay of a key whose decision was answered
// MaxAttempts times already: its record holds no more (a record's size is bounded).
var ErrIdempotencyKeyExhausted = errors.New("idempotency key replayed too often")

// MaxAttempts is how many requests may be answered with one idempotency key's decision: the
// first and its replays (lua/admit.lua, MAX_ATTEMPTS).
const MaxAttempts = 16

// ReplayError is returned for a replay of an idempotency key by a request that refuses
// replays (Request.RefuseReplay): EventID is the first decision's event.
type ReplayError struct{ EventID string }

func (e *ReplayError) Error() string {
	return "idempotency key replayed: the request was admitted before as " + e.EventID
}

// ErrNotSent wraps a script call's error when the call certainly never reached Redis (no
// connection could be had): nothing was decided, so there is nothing to void.
var ErrNotSent = errors.New("not sent to redis")
