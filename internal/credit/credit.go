// Package credit keeps prepaid credit grants: the ledger in PostgreSQL (credit_grants,
// migrations/00013_credits.sql) and each grant's remaining units in Redis, where the
// admission script draws them (lua/admit.lua). PostgreSQL is written first; Redis follows
// with scripts that are safe to run again (lua/grant.lua, lua/grant_void.lua).
package credit

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/policy"
)

// Errors of the store; check them with errors.Is.
var (
	// ErrUnknownAccount: the account does not exist.
	ErrUnknownAccount = errors.New("unknown account")
	// ErrNotFound: the grant does not exist, or belongs to another account.
	ErrNotFound = errors.New("grant not found")
	// ErrIdempotencyKeyReused: a grant with the same account and idempotency key exists
	// with other terms (unit, amount, effect, expiry, priority or source).
	ErrIdempotencyKeyReused = errors.New("idempotency key reused with other terms")
)

// InvalidError is returned for every input the store refuses; nothing is written.
type InvalidError struct {
	Field   string // unit, amount, effective_at, expiry, priority, source, idempotency_key
	Message string
}

// Error returns "field: message".
func (e *InvalidError) Error() string { return e.Field + ": " + e.Message }

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Sources of a grant.
const (
	Purchase    = "purchase"    // bought
	Promotional = "promotional" // given
	Plan        = "plan"        // a plan's recurring grant
)

// MaxAmount is the largest grant, policy.MaxAmount: balances are read as Lua numbers
// (doubles) by the admission script, exact only up to 2^53, and an account may hold many
// grants.
const MaxAmount = policy.MaxAmount

// MaxIdempotencyKey is the longest idempotency key, in bytes.
const MaxIdempotencyKey = 255

// GrantRequest asks for a grant of Amount units of Unit to Account.
type GrantRequest struct {
	Account string
	Unit    policy.Unit
	Amount  int64
	// EffectiveAt is when the grant may first be drawn; nil means now. A retry with the
	// same idempotency key and no EffectiveAt matches the grant whatever its effect.
	EffectiveAt *time.Time
	// ExpiresAt is when the grant stops being drawn; nil means never.
	ExpiresAt *time.Time
	Priority  int    // 0-100, higher drawn first
	Source    string // Purchase, Promotional or Plan
	// IdempotencyKey makes a retried grant the same grant (per account); "" means none.
	IdempotencyKey string
}

// Grant is a grant as recorded.
type Grant struct {
	ID             string      `json:"id"`
	Org            string      `json:"org"`
	Account        string      `json:"account"`
	Unit           policy.Unit `json:"unit"`
	Amount         int64       `json:"amount"`
	EffectiveAt    time.Time   `json:"effective_at"`
	ExpiresAt      *time.Time  `json:"expires_at,omitempty"`
	Priority       int         `json:"priority"`
	Source         string      `json:"source"`
	IdempotencyKey string      `json:"idempotency_key,omitempty"`
	CreatedAt      time.Time   `json:"created_at"`
	// VoidedAt and VoidedUnits are set once the grant is voided: VoidedUnits is what Redis
	// held of it then.
	VoidedAt    *time.Time `json:"voided_at,omitempty"`
	VoidedUnits *int64     `json:"voided_units,omitempty"`
}

// terms is the grant's field in the GrantTerms hash.
func (g Grant) terms() string { return Terms(g.Priority, g.EffectiveAt, g.ExpiresAt) }

// Terms is a grant's field in the GrantTerms hash, as lua/admit.lua reads it:
// "<priority>|<effective ms>|<expires ms, 0 = never>" (expires nil: never).
func Terms(priority int, effective time.Time, expires *time.Time) string {
	var exp int64
	if expires != nil {
		exp = expires.UnixMilli()
	}
	return strconv.Itoa(priority) + "|" + strconv.FormatInt(effective.UnixMilli(), 10) + "|" + strconv.FormatInt(exp, 10)
}

// terms of a grant as Redis holds them.
type terms struct {
	priority           int
	effective, expires int64 // ms since the epoch; expires 0 = never
}

func parseTerms(s string) (terms, bool) {
	var t terms
	parts := strings.Split(s, "|")
	if len(parts) != 3 {
		return t, false
	}
	var err1, err2, err3 error
	t.priority, err1 = strconv.Atoi(parts[0])
	t.effective, err2 = strconv.ParseInt(parts[1], 10, 64)
	t.expires, err3 = strconv.ParseInt(parts[2], 10, 64)
	return t, err1 == nil && err2 == nil && err3 == nil
}

// drawable reports whether the admission script would draw from a grant with these terms
// at now (ms since the epoch).
func (t terms) drawable(now int64) bool {
	return t.effective <= now && (t.expires == 0 || now < t.expires)
}

func newGrantID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return "gr_" + hex.EncodeToString(b)
}

// validate checks r and returns the grant it asks for (without id, org and creation time),
// its times rounded to what PostgreSQL stores (microseconds).
func (r GrantRequest) validate(now time.Time) (Grant, error) {
	g := Grant{Account: r.Account, Unit: r.Unit, Amount: r.Amount, Priority: r.Priority, Source: r.Source, IdempotencyKey: r.IdempotencyKey}
	if !r.Unit.Valid() {
		return g, invalid("unit", "unknown unit %q (known: requests, tokens, credits, cost_micros)", r.Unit)
	}
	if r.Amount <= 0 || r.Amount > MaxAmount {
		return g, invalid("amount", "amount must be a whole number of units from 1 to %d", int64(MaxAmount))
	}
	g.EffectiveAt = now.Truncate(time.Microsecond).UTC()
	if r.EffectiveAt != nil {
		g.EffectiveAt = r.EffectiveAt.Truncate(time.Microsecond).UTC()
	}
	if r.ExpiresAt != nil {
		e := r.ExpiresAt.Truncate(time.Microsecond).UTC()
		if !e.After(g.EffectiveAt) {
			return g, invalid("expiry", "expires_at must be after effective_at")
		}
		if !e.After(now) {
			return g, invalid("expiry", "expires_at is in the past")
		}
		g.ExpiresAt = &e
	}
	if r.Priority < 0 || r.Priority > 100 {
		return g, invalid("priority", "priority must be from 0 to 100")
	}
	switch r.Source {
	case Purchase, Promotional, Plan:
	default:
		return g, invalid("source", "source must be purchase, promotional or plan")
	}
	if len(r.IdempotencyKey) > MaxIdempotencyKey {
		return g, invalid("idempotency_key", "idempotency_key is longer than %d characters", MaxIdempotencyKey)
	}
	for i := range len(r.IdempotencyKey) {
		if c := r.IdempotencyKey[i]; c < 0x21 || c > 0x7e {
			return g, invalid("idempotency_key", "idempotency_key may hold only printable ASCII without spaces")
		}
	}
	return g, nil
}

// sameTerms reports whether a retry r asks for the grant g that its key already made.
func (r GrantRequest) sameTerms(asked, g Grant) bool {
	if asked.Unit != g.Unit || asked.Amount != g.Amount || asked.Priority != g.Priority || asked.Source != g.Source {
		return false
	}
	if r.EffectiveAt != nil && !asked.EffectiveAt.Equal(g.EffectiveAt) {
		return false
	}
	if (asked.ExpiresAt == nil) != (g.ExpiresAt == nil) {
		return false
	}
	return asked.ExpiresAt == nil || asked.ExpiresAt.Equal(*g.ExpiresAt)
}
