// Package customer keeps customer tokens: the credentials an operator issues to one of its
// customers for one account and everything below it, with scopes that say what the holder
// may do there, for the customer API and portal (docs/portal.md).
package customer

import (
	"errors"
	"slices"
	"time"
)

// TokenPrefix starts every customer token: "mgc_" and 43 characters of base64url.
const TokenPrefix = "mgc_"

// idPrefix starts every token's id: "ct_" and 16 hex digits (credential.New).
const idPrefix = "ct_"

// Scope is what a customer token lets its holder do on its account's subtree.
type Scope string

// The scopes.
const (
	// UsageRead reads usage and what remains of the limits.
	UsageRead Scope = "usage:read"
	// BillingRead reads balances, grants, invoices and credit notes.
	BillingRead Scope = "billing:read"
	// KeysWrite creates and revokes the API keys of the subtree.
	KeysWrite Scope = "keys:write"
	// AccountsWrite creates teams, users and agents below the token's account and sets
	// their limits, within the token account's own.
	AccountsWrite Scope = "accounts:write"
)

// Scopes lists every scope, in the order a token's scopes are kept.
var Scopes = []Scope{UsageRead, BillingRead, KeysWrite, AccountsWrite}

// Valid reports whether s is a scope.
func (s Scope) Valid() bool { return slices.Contains(Scopes, s) }

// The lifetime of a token.
const (
	// DefaultTTL is how long a token lives when its maker does not say.
	DefaultTTL = 30 * 24 * time.Hour
	// MaxTTL is the longest a token lives (90 days; the table's CHECK holds it too).
	MaxTTL = 90 * 24 * time.Hour
	// MinTTL is the shortest.
	MinTTL = time.Second
)

// MaxName is the longest name of a token, in characters.
const MaxName = 200

var (
	// ErrInvalid is returned for a token that does not validate (an *InvalidError says
	// which field).
	ErrInvalid = errors.New("invalid customer token")
	// ErrUnknownAccount is returned by Create for an account that does not exist.
	ErrUnknownAccount = errors.New("unknown account")
	// ErrNotFound is returned for a token id that does not exist (or is revoked already,
	// for Revoke), and by Authenticate for any token that is not live.
	ErrNotFound = errors.New("not found")
)

// InvalidError is a token that does not validate: Field ("account", "scope", "ttl",
// "name") says what, Message why. It is an ErrInvalid.
type InvalidError struct{ Field, Message string }

func (e *InvalidError) Error() string { return ErrInvalid.Error() + ": " + e.Message }

// Unwrap makes an InvalidError an ErrInvalid.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

// Token is a customer token as stored: never its secret, which Create returns once.
type Token struct {
	ID string `json:"id"`
	// Account is the token's account: the holder acts on it and everything below it.
	Account string `json:"account"`
	// Org is the account's org, the customer.
	Org       string     `json:"org"`
	Scopes    []Scope    `json:"scopes"`
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	CreatedBy string     `json:"created_by"`
	ExpiresAt time.Time  `json:"expires_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	RevokedBy string     `json:"revoked_by,omitempty"`
}

// Has reports whether the token has scope s.
func (t Token) Has(s Scope) bool { return slices.Contains(t.Scopes, s) }

// Filter selects the tokens List returns.
type Filter struct {
	// Org and Account keep the tokens of that org and of that account ("": any).
	Org, Account string
	// IncludeRevoked lists the tokens that no longer work, revoked or expired, too.
	IncludeRevoked bool
}
