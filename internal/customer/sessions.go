package customer

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/credential"
)

// Portal sessions: one-time links to the customer portal (docs/portal.md#portal-sessions).
const (
	// LinkPrefix starts every link's code: "mgp_" and 43 characters of base64url.
	LinkPrefix = "mgp_"
	// LinkTTL is how long a link may be opened after it was made.
	LinkTTL = 5 * time.Minute
	// SessionTTL is the lifetime of the customer token that opening a link makes: the
	// portal session's.
	SessionTTL = time.Hour
	// MaxReturnURL is the longest return_url, in characters (the OpenAPI document's maxLength).
	MaxReturnURL = 2000
)

// sessionIDPrefix starts every session's id: "ps_" and 16 hex digits.
const sessionIDPrefix = "ps_"

// Session is a portal session link as stored: never its code, which CreateSession returns
// once.
type Session struct {
	ID      string  `json:"id"`
	Account string  `json:"account"`
	Org     string  `json:"org"`
	Scopes  []Scope `json:"scopes"`
	// ReturnURL is where the portal's "Back" link goes: the operator's site.
	ReturnURL string    `json:"return_url"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	// ExpiresAt is when the link can no longer be opened (LinkTTL after it was made).
	ExpiresAt time.Time `json:"expires_at"`
	// OpenedAt is when the link was opened, and TokenID the customer token that made; a
	// link opens once.
	OpenedAt *time.Time `json:"opened_at,omitempty"`
	TokenID  string     `json:"token_id,omitempty"`
}

// The statements of portal sessions.
var (
	//go:embed sql/insert_session.sql
	insertSessionSQL string
	//go:embed sql/open_session.sql
	openSessionSQL string
	//go:embed sql/session_by_token.sql
	sessionByTokenSQL string
)

// CreateSession makes a link to a portal session of account with scopes, whose "Back"
// link goes to returnURL (an absolute http or https URL), made by by. It returns the
// session and the link's code, shown this once: stored as its SHA-256 only, it can be
// opened (OpenSession) once within LinkTTL. An *InvalidError for a field that does not
// validate ("account", "scope", "return_url"), ErrUnknownAccount for an account that does
// not exist.
func (s *Store) CreateSession(ctx context.Context, account string, scopes []Scope, returnURL, by string) (Session, string, error) {
	kept, err := validate(account, scopes, SessionTTL, "")
	if err != nil {
		return Session{}, "", err
	}
	if err := validReturnURL(returnURL); err != nil {
		return Session{}, "", err
	}
	id, code := credential.New(sessionIDPrefix, LinkPrefix)
	rows, err := s.pool.Query(ctx, insertSessionSQL, pgx.StrictNamedArgs{
		"id": id, "account": account, "scopes": names(kept), "return_url": returnURL, "code_hash": credential.Hash(code),
		"created_by": by, "ttl_us": LinkTTL.Microseconds(),
	})
	if err != nil {
		return Session{}, "", fmt.Errorf("make a portal session of %q: %w", account, err)
	}
	sess, err := pgx.CollectExactlyOneRow(rows, scanSession)
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, "", fmt.Errorf("account %q: %w", account, ErrUnknownAccount)
	}
	if err != nil {
		return Session{}, "", fmt.Errorf("make a portal session of %q: %w", account, err)
	}
	return sess, code, nil
}

// returnURL is the form of a return_url, as the OpenAPI document states it too: http or
// https, a host without user info, then a path, query or fragment; no spaces or control
// characters anywhere.
var returnURL = regexp.MustCompile(`^https?://[^/?#@\s\x00-\x1f\x7f-\x9f]+([/?#][^\s\x00-\x1f\x7f-\x9f]*)?$`)

// validReturnURL checks a return_url: an absolute http or https URL of returnURL's form, at
// most MaxReturnURL characters.
func validReturnURL(raw string) error {
	if !utf8.ValidString(raw) || utf8.RuneCountInString(raw) > MaxReturnURL || !returnURL.MatchString(raw) {
		return &InvalidError{Field: "return_url", Message: fmt.Sprintf(
			"return_url %q: an absolute http or https URL (https://example.com/account) without user info, spaces or control characters, at most %d characters",
			raw, MaxReturnURL)}
	}
	return nil
}

// OpenSession opens the link whose code is code, once: it makes a customer token of the
// session's account and scopes living SessionTTL (named after the session, made by whom
// made the link) and returns the session, the token and its secret, shown this once.
// ErrNotFound for a code that is unknown, opened already or expired, or whose account is
// gone; a link that fails so stays as it was.
func (s *Store) OpenSession(ctx context.Context, code string) (Session, Token, string, error) {
	if !strings.HasPrefix(code, LinkPrefix) || len(code) != len(LinkPrefix)+43 {
		return Session{}, Token{}, "", ErrNotFound
	}
	var (
		sess   Session
		tok    Token
		secret string
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var tokenID string
		tokenID, secret = credential.New(idPrefix, TokenPrefix)
		rows, err := tx.Query(ctx, openSessionSQL, pgx.StrictNamedArgs{"code_hash": credential.Hash(code), "token_id": tokenID})
		if err != nil {
			return err
		}
		if sess, err = pgx.CollectExactlyOneRow(rows, scanSession); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, insertTokenSQL, pgx.StrictNamedArgs{
			"id": tokenID, "account": sess.Account, "scopes": names(sess.Scopes), "token_hash": credential.Hash(secret),
			"name": "portal session " + sess.ID, "created_by": sess.CreatedBy, "ttl_us": SessionTTL.Microseconds(),
		})
		if err != nil {
			return err
		}
		tok, err = pgx.CollectExactlyOneRow(rows, scanToken)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, Token{}, "", ErrNotFound
	}
	if err != nil {
		return Session{}, Token{}, "", fmt.Errorf("open a portal session: %w", err)
	}
	return sess, tok, secret, nil
}

// SessionOf returns the portal session whose opening made token tokenID; ErrNotFound when
// no session made it (a token issued through the admin API).
func (s *Store) SessionOf(ctx context.Context, tokenID string) (Session, error) {
	if !credential.ValidID(tokenID, idPrefix) {
		return Session{}, fmt.Errorf("portal session of token %q: %w", tokenID, ErrNotFound)
	}
	rows, err := s.pool.Query(ctx, sessionByTokenSQL, pgx.StrictNamedArgs{"token_id": tokenID})
	if err != nil {
		return Session{}, fmt.Errorf("read the portal session of token %q: %w", tokenID, err)
	}
	sess, err := pgx.CollectExactlyOneRow(rows, scanSession)
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, fmt.Errorf("portal session of token %q: %w", tokenID, ErrNotFound)
	}
	if err != nil {
		return Session{}, fmt.Errorf("read the portal session of token %q: %w", tokenID, err)
	}
	return sess, nil
}

// scanSession reads a row of insert_session.sql's columns.
func scanSession(r pgx.CollectableRow) (Session, error) {
	var sess Session
	var scopes []string
	var tokenID *string
	err := r.Scan(&sess.ID, &sess.Account, &sess.Org, &scopes, &sess.ReturnURL, &sess.CreatedAt, &sess.CreatedBy,
		&sess.ExpiresAt, &sess.OpenedAt, &tokenID)
	sess.Scopes = make([]Scope, len(scopes))
	for i, sc := range scopes {
		sess.Scopes[i] = Scope(sc)
	}
	if tokenID != nil {
		sess.TokenID = *tokenID
	}
	return sess, err
}
