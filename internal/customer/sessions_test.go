package customer_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/customer"
)

// A link's code is shown once and stored as its SHA-256; it opens once, within LinkTTL,
// into a customer token of the session's account and scopes living an hour, which
// SessionOf traces back to the session.
func TestSessionOpensOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sess, code, err := b.store.CreateSession(b.ctx, "acme-ml", []customer.Scope{customer.KeysWrite, customer.UsageRead},
		"https://acme.example/account?tab=usage", "st_0123456789abcdef")
	require.NoError(t, err)
	require.Regexp(t, `^ps_[0-9a-f]{16}$`, sess.ID)
	require.Regexp(t, `^mgp_[A-Za-z0-9_-]{43}$`, code)
	require.Equal(t, "acme", sess.Org)
	require.Equal(t, []customer.Scope{customer.UsageRead, customer.KeysWrite}, sess.Scopes, "in the order of Scopes")
	require.Equal(t, "https://acme.example/account?tab=usage", sess.ReturnURL)
	require.Equal(t, customer.LinkTTL, sess.ExpiresAt.Sub(sess.CreatedAt))
	require.Nil(t, sess.OpenedAt)

	var hashed, plain int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) filter (where code_hash = sha256(convert_to($1, 'UTF8'))),
		count(*) filter (where strpos(s::text, $1) > 0) from portal_sessions s`, code).Scan(&hashed, &plain))
	require.Equal(t, 1, hashed, "the code is kept as its SHA-256")
	require.Zero(t, plain, "and nowhere as itself")

	opened, tok, secret, err := b.store.OpenSession(b.ctx, code)
	require.NoError(t, err)
	require.Equal(t, sess.ID, opened.ID)
	require.NotNil(t, opened.OpenedAt)
	require.Equal(t, tok.ID, opened.TokenID)
	require.Equal(t, "acme-ml", tok.Account)
	require.Equal(t, sess.Scopes, tok.Scopes)
	require.Equal(t, customer.SessionTTL, tok.ExpiresAt.Sub(tok.CreatedAt))
	require.Equal(t, "st_0123456789abcdef", tok.CreatedBy, "made by whom made the link")
	require.Equal(t, "portal session "+sess.ID, tok.Name)
	got, err := b.store.Authenticate(b.ctx, secret)
	require.NoError(t, err)
	require.Equal(t, tok.ID, got.ID)

	_, _, _, err = b.store.OpenSession(b.ctx, code)
	require.ErrorIs(t, err, customer.ErrNotFound, "a link opens once")
	of, err := b.store.SessionOf(b.ctx, tok.ID)
	require.NoError(t, err)
	require.Equal(t, sess.ID, of.ID)
	require.Equal(t, sess.ReturnURL, of.ReturnURL)

	other, _, err := b.store.Create(b.ctx, "acme", []customer.Scope{customer.UsageRead}, customer.DefaultTTL, "", "test")
	require.NoError(t, err)
	_, err = b.store.SessionOf(b.ctx, other.ID)
	require.ErrorIs(t, err, customer.ErrNotFound, "a token issued through the admin API has no session")
	_, err = b.store.SessionOf(b.ctx, "ct_\x00")
	require.ErrorIs(t, err, customer.ErrNotFound)
}

// Of many openings of one link at once, one opens it.
func TestSessionOpensOnceConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, code, err := b.store.CreateSession(b.ctx, "acme", []customer.Scope{customer.UsageRead}, "https://acme.example/", "test")
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, _, _, errs[i] = b.store.OpenSession(b.ctx, code) })
	}
	wg.Wait()
	var opened int
	for _, err := range errs {
		if err == nil {
			opened++
			continue
		}
		require.ErrorIs(t, err, customer.ErrNotFound)
	}
	require.Equal(t, 1, opened)
	var tokens int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from customer_tokens`).Scan(&tokens))
	require.Equal(t, 1, tokens, "the refused openings made no token")
}

// An expired link, a link whose account is gone, and a code of no link open nothing; the
// first two stay unopened.
func TestSessionRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	expired, code, err := b.store.CreateSession(b.ctx, "acme", []customer.Scope{customer.BillingRead}, "http://localhost:3000/back", "test")
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `update portal_sessions set created_at = created_at - interval '10 minutes',
		expires_at = expires_at - interval '10 minutes' where id = $1`, expired.ID)
	require.NoError(t, err)
	_, _, _, err = b.store.OpenSession(b.ctx, code)
	require.ErrorIs(t, err, customer.ErrNotFound, "expired")

	gone, goneCode, err := b.store.CreateSession(b.ctx, "acme-ml", []customer.Scope{customer.UsageRead}, "https://acme.example/", "test")
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `delete from accounts where id = 'acme-ml'`)
	require.NoError(t, err)
	_, _, _, err = b.store.OpenSession(b.ctx, goneCode)
	require.ErrorIs(t, err, customer.ErrNotFound, "account gone")

	var opened int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from portal_sessions where opened_at is not null and id in ($1, $2)`,
		expired.ID, gone.ID).Scan(&opened))
	require.Zero(t, opened)
	for _, c := range []string{"", "mgp_", code[:len(code)-1], strings.Replace(code, "mgp_", "mgc_", 1), "mgp_" + strings.Repeat("\x00", 43),
		"mgp_" + strings.Repeat("A", 43)} {
		_, _, _, err = b.store.OpenSession(b.ctx, c)
		require.ErrorIs(t, err, customer.ErrNotFound, "%q", c)
	}
}

// CreateSession refuses a return_url that is not an absolute http(s) URL, bad scopes and
// accounts, and an account that does not exist.
func TestCreateSessionValidates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	read := []customer.Scope{customer.UsageRead}
	for _, tt := range []struct {
		name, account string
		scopes        []customer.Scope
		returnURL     string
		field         string
	}{
		{"relative", "acme", read, "/account", "return_url"},
		{"no scheme", "acme", read, "acme.example/account", "return_url"},
		{"javascript", "acme", read, "javascript:alert(1)", "return_url"},
		{"ftp", "acme", read, "ftp://acme.example/", "return_url"},
		{"no host", "acme", read, "https:///path", "return_url"},
		{"user info", "acme", read, "https://user:pw@acme.example/", "return_url"},
		{"space", "acme", read, "https://acme.example/a b", "return_url"},
		{"newline", "acme", read, "https://acme.example/\n", "return_url"},
		{"empty", "acme", read, "", "return_url"},
		{"too long", "acme", read, "https://acme.example/" + strings.Repeat("a", customer.MaxReturnURL), "return_url"},
		{"upper-case scheme", "acme", read, "HTTPS://acme.example/", "return_url"},
		{"no scope", "acme", nil, "https://acme.example/", "scope"},
		{"bad scope", "acme", []customer.Scope{"admin"}, "https://acme.example/", "scope"},
		{"bad account", "a/b", read, "https://acme.example/", "account"},
	} {
		_, _, err := b.store.CreateSession(b.ctx, tt.account, tt.scopes, tt.returnURL, "test")
		var inv *customer.InvalidError
		require.True(t, errors.As(err, &inv), "%s: %v", tt.name, err)
		require.Equal(t, tt.field, inv.Field, tt.name)
	}
	_, _, err := b.store.CreateSession(b.ctx, "nobody", read, "https://acme.example/", "test")
	require.ErrorIs(t, err, customer.ErrUnknownAccount)
	_, _, err = b.store.CreateSession(b.ctx, "acme", read, "https://acme.example/"+strings.Repeat("a", customer.MaxReturnURL-21), "test")
	require.NoError(t, err, "MaxReturnURL bytes is allowed")
}
