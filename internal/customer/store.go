package customer

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/credential"
	"github.com/metergate/metergate/internal/policy"
)

// Store keeps customer tokens in PostgreSQL. It caches nothing: every Authenticate reads
// the token, so a token revoked or expired is refused on every node from that moment.
type Store struct{ pool *pgxpool.Pool }

// NewStore returns a Store over pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// The statements of customer tokens.
var (
	//go:embed sql/insert_token.sql
	insertTokenSQL string
	//go:embed sql/token_by_hash.sql
	tokenByHashSQL string
	//go:embed sql/token_by_id.sql
	tokenByIDSQL string
	//go:embed sql/list_tokens.sql
	listTokensSQL string
	//go:embed sql/list_live_tokens.sql
	listLiveTokensSQL string
	//go:embed sql/revoke_token.sql
	revokeTokenSQL string
)

// Create issues a token of account with scopes, living ttl, named name (free text, may be
// empty), made by by, and returns it with its secret: shown this once, stored as its
// SHA-256 only. Duplicate scopes count once. An *InvalidError for a field that does not
// validate, ErrUnknownAccount for an account that does not exist.
func (s *Store) Create(ctx context.Context, account string, scopes []Scope, ttl time.Duration, name, by string) (Token, string, error) {
	kept, err := validate(account, scopes, ttl, name)
	if err != nil {
		return Token{}, "", err
	}
	id, secret := credential.New(idPrefix, TokenPrefix)
	rows, err := s.pool.Query(ctx, insertTokenSQL, pgx.StrictNamedArgs{
		"id": id, "account": account, "scopes": names(kept), "token_hash": credential.Hash(secret), "name": name,
		"created_by": by, "ttl_us": ttl.Microseconds(),
	})
	if err != nil {
		return Token{}, "", fmt.Errorf("issue a token of %q: %w", account, err)
	}
	t, err := pgx.CollectExactlyOneRow(rows, scanToken)
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, "", fmt.Errorf("account %q: %w", account, ErrUnknownAccount)
	}
	if err != nil {
		return Token{}, "", fmt.Errorf("issue a token of %q: %w", account, err)
	}
	return t, secret, nil
}

// validate checks a token's fields and returns its scopes without duplicates, in the order
// of Scopes.
func validate(account string, scopes []Scope, ttl time.Duration, name string) ([]Scope, error) {
	if !policy.ValidID(account) {
		return nil, &InvalidError{Field: "account",
			Message: fmt.Sprintf("account %q: an account id, 1-64 of [A-Za-z0-9._-] starting with a letter or digit", account)}
	}
	for _, sc := range scopes {
		if !sc.Valid() {
			return nil, &InvalidError{Field: "scope", Message: fmt.Sprintf("scope %q: want one of %v", sc, Scopes)}
		}
	}
	var kept []Scope
	for _, sc := range Scopes {
		if slices.Contains(scopes, sc) {
			kept = append(kept, sc)
		}
	}
	if len(kept) == 0 {
		return nil, &InvalidError{Field: "scope", Message: fmt.Sprintf("a token needs at least one scope of %v", Scopes)}
	}
	if ttl < MinTTL || ttl > MaxTTL {
		return nil, &InvalidError{Field: "ttl", Message: fmt.Sprintf("ttl %v: want %v to %v (90 days)", ttl, MinTTL, MaxTTL)}
	}
	// Characters, not bytes: the bound of the table's CHECK and of the OpenAPI document.
	if utf8.RuneCountInString(name) > MaxName || !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl) {
		return nil, &InvalidError{Field: "name",
			Message: fmt.Sprintf("name %q: at most %d characters, no control characters", name, MaxName)}
	}
	return kept, nil
}

// names are scopes as the table's text[] keeps them.
func names(scopes []Scope) []string {
	out := make([]string, len(scopes))
	for i, sc := range scopes {
		out[i] = string(sc)
	}
	return out
}

// Authenticate returns the live token whose secret is secret: not revoked, not expired,
// its account still existing in its org; ErrNotFound for any other secret (unknown,
// revoked, expired, malformed). The lookup is by the secret's SHA-256, so no comparison
// of the secret leaks its bytes through time.
func (s *Store) Authenticate(ctx context.Context, secret string) (Token, error) {
	if !strings.HasPrefix(secret, TokenPrefix) || len(secret) > 100 {
		return Token{}, ErrNotFound
	}
	t, err := s.one(ctx, tokenByHashSQL, pgx.StrictNamedArgs{"token_hash": credential.Hash(secret)})
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, ErrNotFound
	}
	if err != nil {
		return Token{}, fmt.Errorf("authenticate a customer token: %w", err)
	}
	return t, nil
}

// Get returns token id, live or not; ErrNotFound when there is none.
func (s *Store) Get(ctx context.Context, id string) (Token, error) {
	if !credential.ValidID(id, idPrefix) {
		return Token{}, fmt.Errorf("customer token %q: %w", id, ErrNotFound)
	}
	t, err := s.one(ctx, tokenByIDSQL, pgx.StrictNamedArgs{"id": id})
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, fmt.Errorf("customer token %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Token{}, fmt.Errorf("read customer token %q: %w", id, err)
	}
	return t, nil
}

// Revoke revokes token id, by by, and returns it revoked: it is refused from the next
// Authenticate on. ErrNotFound when there is no token id or it is revoked already (an
// expired token can still be revoked).
func (s *Store) Revoke(ctx context.Context, id, by string) (Token, error) {
	if !credential.ValidID(id, idPrefix) {
		return Token{}, fmt.Errorf("customer token %q: %w", id, ErrNotFound)
	}
	t, err := s.one(ctx, revokeTokenSQL, pgx.StrictNamedArgs{"id": id, "revoked_by": by})
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, fmt.Errorf("customer token %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Token{}, fmt.Errorf("revoke customer token %q: %w", id, err)
	}
	return t, nil
}

// List returns the tokens f selects, newest first: the live ones, or every one with
// f.IncludeRevoked. No secrets: the store has none.
func (s *Store) List(ctx context.Context, f Filter) ([]Token, error) {
	query := listLiveTokensSQL
	if f.IncludeRevoked {
		query = listTokensSQL
	}
	rows, err := s.pool.Query(ctx, query, pgx.StrictNamedArgs{"org": nullable(f.Org), "account": nullable(f.Account)})
	if err != nil {
		return nil, fmt.Errorf("list customer tokens: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanToken)
	if err != nil {
		return nil, fmt.Errorf("list customer tokens: %w", err)
	}
	return out, nil
}

// one runs a query of one row of list_tokens.sql's columns; pgx.ErrNoRows when it has none.
func (s *Store) one(ctx context.Context, query string, args pgx.StrictNamedArgs) (Token, error) {
	rows, err := s.pool.Query(ctx, query, args)
	if err != nil {
		return Token{}, err
	}
	return pgx.CollectExactlyOneRow(rows, scanToken)
}

// nullable is a filter's value: NULL for "", any.
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// scanToken reads a row of list_tokens.sql's columns.
func scanToken(r pgx.CollectableRow) (Token, error) {
	var t Token
	var scopes []string
	err := r.Scan(&t.ID, &t.Account, &t.Org, &scopes, &t.Name, &t.CreatedAt, &t.CreatedBy, &t.ExpiresAt,
		&t.RevokedAt, &t.RevokedBy)
	t.Scopes = make([]Scope, len(scopes))
	for i, sc := range scopes {
		t.Scopes[i] = Scope(sc)
	}
	return t, err
}
