package customer_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// testBundle is a Store on a migrated schema of the test's own, with an org acme, its team
// acme-ml and another org globex.
type testBundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool // the schema's owner: the test changes rows behind the store's back
	store *customer.Store
}

func setup(t *testing.T) testBundle {
	t.Helper()
	pool, _ := testenv.EmptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `insert into accounts (id, kind, parent, org) values
		('acme', 'org', null, 'acme'), ('acme-ml', 'team', 'acme', 'acme'), ('globex', 'org', null, 'globex')`)
	require.NoError(t, err)
	return testBundle{ctx: ctx, pool: pool, store: customer.NewStore(pool)}
}

// A token is shown once, stored as its SHA-256 only, authenticates with its account, org
// and scopes until revoked, and then nothing; Get and List never hold the secret.
func TestTokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok, secret, err := b.store.Create(b.ctx, "acme-ml", []customer.Scope{customer.KeysWrite, customer.UsageRead, customer.KeysWrite},
		customer.DefaultTTL, "Acme's portal backend", "st_0123456789abcdef")
	require.NoError(t, err)
	require.Regexp(t, `^ct_[0-9a-f]{16}$`, tok.ID)
	require.Regexp(t, `^mgc_[A-Za-z0-9_-]{43}$`, secret)
	require.Equal(t, "acme-ml", tok.Account)
	require.Equal(t, "acme", tok.Org, "the account's org")
	require.Equal(t, []customer.Scope{customer.UsageRead, customer.KeysWrite}, tok.Scopes, "once each, in the order of Scopes")
	require.Equal(t, "st_0123456789abcdef", tok.CreatedBy)
	require.Equal(t, customer.DefaultTTL, tok.ExpiresAt.Sub(tok.CreatedAt))
	require.Nil(t, tok.RevokedAt)

	var hashed, plain int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) filter (where token_hash = sha256(convert_to($1, 'UTF8'))),
		count(*) filter (where strpos(t::text, $1) > 0) from customer_tokens t`, secret).Scan(&hashed, &plain))
	require.Equal(t, 1, hashed, "the secret is kept as its SHA-256")
	require.Zero(t, plain, "and only so")

	got, err := b.store.Authenticate(b.ctx, secret)
	require.NoError(t, err)
	require.Equal(t, tok, got)
	require.True(t, got.Has(customer.KeysWrite))
	require.False(t, got.Has(customer.AccountsWrite))
	for _, bad := range []string{"", secret + "x", strings.TrimPrefix(secret, customer.TokenPrefix), customer.TokenPrefix + "nope",
		"mgs_" + strings.TrimPrefix(secret, customer.TokenPrefix)} {
		_, err := b.store.Authenticate(b.ctx, bad)
		require.ErrorIs(t, err, customer.ErrNotFound, "%q", bad)
	}

	read, err := b.store.Get(b.ctx, tok.ID)
	require.NoError(t, err)
	require.Equal(t, tok, read)
	// Ids of no form, and bytes PostgreSQL refuses in a text, are no token's too.
	for _, id := range []string{"ct_0000000000000000", "", "ct_", "ct_ABCDEF0000000000", tok.ID + "0", "ct_\x00", "ct_\xff", tok.ID[:18] + "\x00"} {
		_, err = b.store.Get(b.ctx, id)
		require.ErrorIs(t, err, customer.ErrNotFound, "%q", id)
		_, err = b.store.Revoke(b.ctx, id, "test")
		require.ErrorIs(t, err, customer.ErrNotFound, "%q", id)
	}

	revoked, err := b.store.Revoke(b.ctx, tok.ID, "admin-token")
	require.NoError(t, err)
	require.NotNil(t, revoked.RevokedAt)
	require.Equal(t, "admin-token", revoked.RevokedBy)
	_, err = b.store.Authenticate(b.ctx, secret)
	require.ErrorIs(t, err, customer.ErrNotFound, "a revoked token is refused at once")
	_, err = b.store.Revoke(b.ctx, tok.ID, "admin-token")
	require.ErrorIs(t, err, customer.ErrNotFound, "revoked already")
	_, err = b.store.Revoke(b.ctx, "ct_0000000000000000", "admin-token")
	require.ErrorIs(t, err, customer.ErrNotFound)
	read, err = b.store.Get(b.ctx, tok.ID)
	require.NoError(t, err)
	require.Equal(t, revoked, read, "a revoked token is still read")
}

// A token that expired is refused, and so is one whose account is gone or now in another
// org; one that has not expired yet works.
func TestAuthenticateRefusesDeadTokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	issue := func(account string) (customer.Token, string) {
		tok, secret, err := b.store.Create(b.ctx, account, []customer.Scope{customer.UsageRead}, time.Hour, "", "test")
		require.NoError(t, err)
		_, err = b.store.Authenticate(b.ctx, secret)
		require.NoError(t, err, "live")
		return tok, secret
	}

	expired, expiredSecret := issue("acme")
	_, err := b.pool.Exec(b.ctx, `update customer_tokens set created_at = now() - interval '2 hours',
		expires_at = now() - interval '1 millisecond' where id = $1`, expired.ID)
	require.NoError(t, err)
	_, err = b.store.Authenticate(b.ctx, expiredSecret)
	require.ErrorIs(t, err, customer.ErrNotFound, "an expired token is refused")

	soon, soonSecret := issue("acme")
	_, err = b.pool.Exec(b.ctx, `update customer_tokens set expires_at = now() + interval '1 minute' where id = $1`, soon.ID)
	require.NoError(t, err)
	_, err = b.store.Authenticate(b.ctx, soonSecret)
	require.NoError(t, err, "not expired yet")

	_, goneSecret := issue("acme-ml")
	_, err = b.pool.Exec(b.ctx, `delete from accounts where id = 'acme-ml'`)
	require.NoError(t, err)
	_, err = b.store.Authenticate(b.ctx, goneSecret)
	require.ErrorIs(t, err, customer.ErrNotFound, "a token of a deleted account is refused")

	moved, movedSecret := issue("globex")
	_, err = b.pool.Exec(b.ctx, `update customer_tokens set org = 'acme' where id = $1`, moved.ID)
	require.NoError(t, err)
	_, err = b.store.Authenticate(b.ctx, movedSecret)
	require.ErrorIs(t, err, customer.ErrNotFound, "a token whose account is not in its org is refused")

	// An expired token can still be revoked (and so leaves no doubt in the list).
	revoked, err := b.store.Revoke(b.ctx, expired.ID, "test")
	require.NoError(t, err)
	require.NotNil(t, revoked.RevokedAt)
}

// Create refuses, as an *InvalidError naming the field, an account id, scopes, a lifetime
// or a name that do not validate, and an account that does not exist as ErrUnknownAccount;
// it writes nothing then.
func TestCreateValidates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	read := []customer.Scope{customer.UsageRead}
	for _, tt := range []struct {
		name    string
		account string
		scopes  []customer.Scope
		ttl     time.Duration
		token   string
		field   string
	}{
		{"no account", "", read, time.Hour, "", "account"},
		{"bad account id", "acme/ml", read, time.Hour, "", "account"},
		{"no scope", "acme", nil, time.Hour, "", "scope"},
		{"empty scopes", "acme", []customer.Scope{}, time.Hour, "", "scope"},
		{"unknown scope", "acme", []customer.Scope{customer.UsageRead, "admin"}, time.Hour, "", "scope"},
		{"scope of another case", "acme", []customer.Scope{"USAGE:READ"}, time.Hour, "", "scope"},
		{"zero ttl", "acme", read, 0, "", "ttl"},
		{"negative ttl", "acme", read, -time.Hour, "", "ttl"},
		{"under a second", "acme", read, time.Second - 1, "", "ttl"},
		{"over 90 days", "acme", read, customer.MaxTTL + time.Microsecond, "", "ttl"},
		{"name too long", "acme", read, time.Hour, strings.Repeat("x", customer.MaxName+1), "name"},
		{"control character", "acme", read, time.Hour, "a\nb", "name"},
		{"not UTF-8", "acme", read, time.Hour, "a\xffb", "name"},
	} {
		_, _, err := b.store.Create(b.ctx, tt.account, tt.scopes, tt.ttl, tt.token, "test")
		require.ErrorIs(t, err, customer.ErrInvalid, tt.name)
		var inv *customer.InvalidError
		require.ErrorAs(t, err, &inv, tt.name)
		require.Equal(t, tt.field, inv.Field, tt.name)
	}
	_, _, err := b.store.Create(b.ctx, "initech", read, time.Hour, "", "test")
	require.ErrorIs(t, err, customer.ErrUnknownAccount)
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from customer_tokens`).Scan(&n))
	require.Zero(t, n, "nothing written")

	// The bounds themselves are taken: 90 days exactly, a second, 200 characters of 2 bytes.
	longest, _, err := b.store.Create(b.ctx, "acme", customer.Scopes, customer.MaxTTL, strings.Repeat("é", customer.MaxName), "test")
	require.NoError(t, err)
	require.Equal(t, customer.MaxTTL, longest.ExpiresAt.Sub(longest.CreatedAt))
	require.Equal(t, customer.Scopes, longest.Scopes)
	_, _, err = b.store.Create(b.ctx, "acme", read, customer.MinTTL, "", "test")
	require.NoError(t, err)
}

// The table holds what the store checks, whoever writes: a token past 90 days, without a
// scope or with an unknown one is refused by PostgreSQL too.
func TestTableChecks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok, _, err := b.store.Create(b.ctx, "acme", []customer.Scope{customer.UsageRead}, time.Hour, "", "test")
	require.NoError(t, err)
	for _, set := range []string{
		`expires_at = created_at + interval '2160 hours 1 microsecond'`,
		`expires_at = created_at`,
		`scopes = '{}'`,
		`scopes = '{usage:read,admin}'`,
		`revoked_at = now()`,
		`name = repeat('x', 201)`,
	} {
		_, err := b.pool.Exec(b.ctx, `update customer_tokens set `+set+` where id = $1`, tok.ID)
		require.Error(t, err, set)
		require.Contains(t, err.Error(), "violates check constraint", set)
	}
}

// List returns the live tokens of an org or an account, newest first, or every token with
// IncludeRevoked; never a secret.
func TestList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	issue := func(account string) customer.Token {
		tok, _, err := b.store.Create(b.ctx, account, []customer.Scope{customer.BillingRead}, time.Hour, account+"'s", "test")
		require.NoError(t, err)
		return tok
	}
	org, team, other, revoked, expired := issue("acme"), issue("acme-ml"), issue("globex"), issue("acme"), issue("acme-ml")
	_, err := b.store.Revoke(b.ctx, revoked.ID, "test")
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `update customer_tokens set created_at = created_at - interval '2 hours',
		expires_at = now() - interval '1 second' where id = $1`, expired.ID)
	require.NoError(t, err)

	ids := func(f customer.Filter) []string {
		list, err := b.store.List(b.ctx, f)
		require.NoError(t, err)
		var out []string
		for _, tok := range list {
			out = append(out, tok.ID)
		}
		return out
	}
	require.Equal(t, []string{other.ID, team.ID, org.ID}, ids(customer.Filter{}), "live ones, newest first")
	require.Equal(t, []string{team.ID, org.ID}, ids(customer.Filter{Org: "acme"}))
	require.Equal(t, []string{team.ID}, ids(customer.Filter{Account: "acme-ml"}))
	require.Equal(t, []string{team.ID}, ids(customer.Filter{Org: "acme", Account: "acme-ml"}))
	require.Empty(t, ids(customer.Filter{Org: "globex", Account: "acme-ml"}))
	require.Equal(t, []string{revoked.ID, team.ID, org.ID, expired.ID}, ids(customer.Filter{Org: "acme", IncludeRevoked: true}),
		"revoked and expired ones too")
	require.Len(t, ids(customer.Filter{IncludeRevoked: true}), 5)
}
