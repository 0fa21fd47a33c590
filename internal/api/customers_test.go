package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/staff"
)

// customerToken is a token as the customer-token routes reply it; Token (the secret) only
// from POST.
type customerToken struct {
	ID        string           `json:"id"`
	Account   string           `json:"account"`
	Org       string           `json:"org"`
	Scopes    []customer.Scope `json:"scopes"`
	Name      string           `json:"name"`
	CreatedAt time.Time        `json:"created_at"`
	CreatedBy string           `json:"created_by"`
	ExpiresAt time.Time        `json:"expires_at"`
	RevokedAt *time.Time       `json:"revoked_at"`
	RevokedBy string           `json:"revoked_by"`
	Token     string           `json:"token"`
}

// issueCustomerToken issues a token through POST /v1/admin/customer-tokens as token,
// wanting 201.
func (b *testBundle) issueCustomerToken(t *testing.T, token string, body map[string]any) customerToken {
	t.Helper()
	r := b.call(t, "POST", "/v1/admin/customer-tokens", token, body)
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	var ct customerToken
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &ct))
	return ct
}

// customerTokens lists tokens through GET /v1/admin/customer-tokens?query, wanting 200, and
// returns their ids and the raw reply.
func (b *testBundle) customerTokens(t *testing.T, query string) ([]string, string) {
	t.Helper()
	var list struct {
		Tokens []customerToken `json:"customer_tokens"`
	}
	r := b.getJSON(t, "/v1/admin/customer-tokens?"+query, &list)
	ids := []string{}
	for _, ct := range list.Tokens {
		ids = append(ids, ct.ID)
	}
	return ids, r.Raw
}

// The customer-token routes issue a token (its secret once, made by the caller), read and
// list tokens without any secret, and revoke them; a revoked or expired token stops
// authenticating at once. Support issues and revokes, finance and viewers only read, and a
// customer token opens neither the admin API nor the service API.
func TestCustomerTokenRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{staff: true, customers: true})
	org, team, other := b.id("org"), b.id("team"), b.id("other")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	b.account(t, map[string]any{"id": team, "kind": "team", "parent": org})
	b.account(t, map[string]any{"id": other, "kind": "org", "plan": "pro"})
	store := customer.NewStore(b.pool)
	sam := b.addStaff(t, adminToken, "Sam Support", staff.Support)
	fiona := b.addStaff(t, adminToken, "Fiona Finance", staff.Finance)

	ml := b.issueCustomerToken(t, sam.Token, map[string]any{"account": team, "scopes": []string{"usage:read", "keys:write"},
		"ttl_s": 3600, "name": "ML team's dashboard"})
	require.Regexp(t, `^ct_[0-9a-f]{16}$`, ml.ID)
	require.Regexp(t, `^mgc_[A-Za-z0-9_-]{43}$`, ml.Token)
	require.Equal(t, team, ml.Account)
	require.Equal(t, org, ml.Org)
	require.Equal(t, []customer.Scope{customer.UsageRead, customer.KeysWrite}, ml.Scopes)
	require.Equal(t, "ML team's dashboard", ml.Name)
	require.Equal(t, sam.ID, ml.CreatedBy, "created_by is the caller")
	require.Equal(t, time.Hour, ml.ExpiresAt.Sub(ml.CreatedAt))
	got, err := store.Authenticate(b.ctx, ml.Token)
	require.NoError(t, err)
	require.Equal(t, ml.ID, got.ID)

	whole := b.issueCustomerToken(t, adminToken, map[string]any{"account": org, "scopes": []string{"billing:read"}})
	require.Equal(t, customer.DefaultTTL, whole.ExpiresAt.Sub(whole.CreatedAt), "30 days when ttl_s is left out")
	require.Equal(t, staff.AdminToken, whole.CreatedBy)
	require.Empty(t, whole.Name)
	elsewhere := b.issueCustomerToken(t, adminToken, map[string]any{"account": other, "scopes": customer.Scopes, "ttl_s": 7776000})
	require.Equal(t, customer.MaxTTL, elsewhere.ExpiresAt.Sub(elsewhere.CreatedAt), "90 days at most, and exactly")

	for _, tt := range []struct {
		name string
		body any
		code string
	}{
		{"no account", map[string]any{"scopes": []string{"usage:read"}}, "invalid_account"},
		{"bad account id", map[string]any{"account": "a/b", "scopes": []string{"usage:read"}}, "invalid_account"},
		{"no scopes", map[string]any{"account": org}, "invalid_scope"},
		{"empty scopes", map[string]any{"account": org, "scopes": []string{}}, "invalid_scope"},
		{"unknown scope", map[string]any{"account": org, "scopes": []string{"usage:read", "admin"}}, "invalid_scope"},
		{"zero ttl", map[string]any{"account": org, "scopes": []string{"usage:read"}, "ttl_s": 0}, "invalid_ttl"},
		{"negative ttl", map[string]any{"account": org, "scopes": []string{"usage:read"}, "ttl_s": -60}, "invalid_ttl"},
		{"over 90 days", map[string]any{"account": org, "scopes": []string{"usage:read"}, "ttl_s": 7776001}, "invalid_ttl"},
		{"fractional ttl", `{"account":"` + org + `","scopes":["usage:read"],"ttl_s":1.5}`, "invalid_field"},
		{"name too long", map[string]any{"account": org, "scopes": []string{"usage:read"}, "name": strings.Repeat("x", 201)}, "invalid_name"},
		{"control character", map[string]any{"account": org, "scopes": []string{"usage:read"}, "name": "a\u0007b"}, "invalid_name"},
		{"a secret of one's own", map[string]any{"account": org, "scopes": []string{"usage:read"}, "token": "mgc_mine"}, "unknown_field"},
		{"expires_at", map[string]any{"account": org, "scopes": []string{"usage:read"}, "expires_at": "2030-01-01T00:00:00Z"}, "unknown_field"},
	} {
		r := b.call(t, "POST", "/v1/admin/customer-tokens", sam.Token, tt.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", tt.name, r.Raw)
		require.Equal(t, tt.code, errCode(r), tt.name)
	}
	r := b.call(t, "POST", "/v1/admin/customer-tokens", sam.Token, map[string]any{"account": b.id("nobody"), "scopes": []string{"usage:read"}})
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)
	require.Equal(t, "not_found", errCode(r))
	r = b.call(t, "POST", "/v1/admin/customer-tokens", fiona.Token, map[string]any{"account": org, "scopes": []string{"usage:read"}})
	require.Equal(t, http.StatusForbidden, r.Status, r.Raw)
	require.Equal(t, "forbidden_role", errCode(r), "finance does not issue customer tokens")

	// Every role reads; no secret, no hash is ever listed or read.
	ids, raw := b.customerTokens(t, "org="+org)
	require.Equal(t, []string{whole.ID, ml.ID}, ids, "the org's, newest first")
	for _, secret := range []string{`"token"`, "hash", "mgc_", ml.Token, whole.Token} {
		require.NotContains(t, raw, secret)
	}
	ids, _ = b.customerTokens(t, "account="+team)
	require.Equal(t, []string{ml.ID}, ids, "the account's own")
	ids, _ = b.customerTokens(t, "org="+org+"&account="+other)
	require.Empty(t, ids)
	r = b.call(t, "GET", "/v1/admin/customer-tokens/"+ml.ID, fiona.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.NotContains(t, r.Raw, ml.Token)
	var read customerToken
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &read))
	require.Equal(t, ml.ID, read.ID)
	require.Equal(t, ml.Scopes, read.Scopes)
	require.True(t, ml.ExpiresAt.Equal(read.ExpiresAt))
	for _, q := range []string{"org=a/b", "account=a/b", "include_revoked=maybe"} {
		r := b.call(t, "GET", "/v1/admin/customer-tokens?"+q, adminToken, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", q, r.Raw)
		require.Equal(t, "invalid_"+strings.Split(q, "=")[0], errCode(r), q)
	}
	for _, id := range []string{"ct_0000000000000000", "nonsense", "ct_%00", "ct_%FF"} {
		r := b.call(t, "GET", "/v1/admin/customer-tokens/"+id, adminToken, nil)
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", id, r.Raw)
	}

	// A customer token opens neither the admin API nor the service API.
	for _, path := range []string{"/v1/admin/customer-tokens", "/v1/admin/accounts/" + team, "/v1/usage/" + team} {
		r := b.call(t, "GET", path, ml.Token, nil)
		require.Equal(t, http.StatusUnauthorized, r.Status, "%s: %s", path, r.Raw)
	}

	// A revocation replies the token revoked, by the caller; the token is refused next.
	r = b.call(t, "DELETE", "/v1/admin/customer-tokens/"+ml.ID, sam.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	var revoked customerToken
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &revoked))
	require.Equal(t, ml.ID, revoked.ID)
	require.NotNil(t, revoked.RevokedAt)
	require.Equal(t, sam.ID, revoked.RevokedBy)
	_, err = store.Authenticate(b.ctx, ml.Token)
	require.ErrorIs(t, err, customer.ErrNotFound, "a revoked token is refused at once")
	for _, id := range []string{ml.ID, "ct_0000000000000000", "nonsense"} {
		r := b.call(t, "DELETE", "/v1/admin/customer-tokens/"+id, adminToken, nil)
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", id, r.Raw)
		require.Equal(t, "not_found", errCode(r), id)
	}
	r = b.call(t, "DELETE", "/v1/admin/customer-tokens/"+whole.ID, fiona.Token, nil)
	require.Equal(t, http.StatusForbidden, r.Status, r.Raw)

	// An expired token is refused, and listed only with the revoked ones.
	_, err = store.Authenticate(b.ctx, whole.Token)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `update customer_tokens set created_at = now() - interval '2 days',
		expires_at = now() - interval '1 second' where id = $1`, whole.ID)
	require.NoError(t, err)
	_, err = store.Authenticate(b.ctx, whole.Token)
	require.ErrorIs(t, err, customer.ErrNotFound, "an expired token is refused")
	ids, _ = b.customerTokens(t, "org="+org)
	require.Empty(t, ids, "neither revoked nor expired tokens are live")
	ids, _ = b.customerTokens(t, "org="+org+"&include_revoked=true")
	require.Equal(t, []string{ml.ID, whole.ID}, ids)
}

// The audit row of an issue keeps the token but not its secret; a revocation's keeps the
// token before (live) and after (revoked).
func TestCustomerTokensAreAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{staff: true, customers: true})
	org := b.id("org")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	sam := b.addStaff(t, adminToken, "Sam Support", staff.Support)
	ct := b.issueCustomerToken(t, sam.Token, map[string]any{"account": org, "scopes": []string{"usage:read"}})
	r := b.call(t, "DELETE", "/v1/admin/customer-tokens/"+ct.ID, sam.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)

	entries, _ := b.audit(t, "actor="+sam.ID)
	require.Len(t, entries, 2)
	revoke, issue := entries[0], entries[1]
	require.Equal(t, "/v1/admin/customer-tokens", issue.Route)
	require.Equal(t, http.StatusCreated, issue.Status)
	require.Empty(t, issue.Before, "an issue has no before")
	var after map[string]any
	require.NoError(t, json.Unmarshal(issue.After, &after))
	require.Equal(t, ct.ID, after["id"])
	require.Equal(t, org, after["account"])
	require.Equal(t, "(redacted)", after["token"], "the secret is not kept")
	require.NotContains(t, string(issue.After), ct.Token)
	require.NotContains(t, string(issue.After), strings.TrimPrefix(ct.Token, customer.TokenPrefix))

	require.Equal(t, "/v1/admin/customer-tokens/{id}", revoke.Route)
	require.Equal(t, "/v1/admin/customer-tokens/"+ct.ID, revoke.Path)
	var before, revoked customerToken
	require.NoError(t, json.Unmarshal(revoke.Before, &before), string(revoke.Before))
	require.NoError(t, json.Unmarshal(revoke.After, &revoked), string(revoke.After))
	require.Equal(t, ct.ID, before.ID)
	require.Nil(t, before.RevokedAt, "live before")
	require.NotNil(t, revoked.RevokedAt, "revoked after")
	require.Equal(t, sam.ID, revoked.RevokedBy)
}

// Without a store of customer tokens their routes answer 503, as the other stores' do.
func TestCustomerTokensWithoutAStore(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true})
	for _, call := range [][2]string{{"POST", "/v1/admin/customer-tokens"}, {"GET", "/v1/admin/customer-tokens"},
		{"GET", "/v1/admin/customer-tokens/ct_0000000000000000"}, {"DELETE", "/v1/admin/customer-tokens/ct_0000000000000000"}} {
		var body any
		if call[0] == "POST" {
			body = map[string]any{"account": "acme", "scopes": []string{"usage:read"}}
		}
		r := b.call(t, call[0], call[1], adminToken, body)
		require.Equal(t, http.StatusServiceUnavailable, r.Status, "%v: %s", call, r.Raw)
		require.Equal(t, "unavailable", errCode(r), call)
	}
}
