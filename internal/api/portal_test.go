package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPortalCredentials: the customer API opens to a live customer token with the route's
// scope: 401 without one, for an unknown or a revoked one; 403 missing_scope without the
// scope; 403 for the admin and service tokens, which open the other APIs.
func TestPortalCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{staff: true, customers: true})
	org := b.id("org")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	b.waitResolvable(t, org)
	reader := b.issueCustomerToken(t, adminToken, map[string]any{"account": org, "scopes": []string{"usage:read"}})
	keys := b.issueCustomerToken(t, adminToken, map[string]any{"account": org, "scopes": []string{"keys:write"}})

	r := b.call(t, "GET", "/v1/portal/me", reader.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Equal(t, reader.ID, r.Body["id"])
	require.Equal(t, org, r.Body["account"])
	require.NotContains(t, r.Raw, reader.Token, "never the secret")

	for _, tt := range []struct {
		name, token string
		status      int
		code        string
	}{
		{"none", "", http.StatusUnauthorized, "unauthorized"},
		{"unknown", "mgc_" + "x0000000000000000000000000000000000000000000", http.StatusUnauthorized, "unauthorized"},
		{"no scope", keys.Token, http.StatusForbidden, "missing_scope"},
		{"admin token", adminToken, http.StatusForbidden, "forbidden"},
		{"service token", serviceToken, http.StatusForbidden, "forbidden"},
	} {
		r := b.call(t, "GET", "/v1/portal/accounts/"+org, tt.token, nil)
		require.Equal(t, tt.status, r.Status, "%s: %s", tt.name, r.Raw)
		require.Equal(t, tt.code, errCode(r), tt.name)
	}

	b.call(t, "DELETE", "/v1/admin/customer-tokens/"+reader.ID, adminToken, nil)
	r = b.call(t, "GET", "/v1/portal/me", reader.Token, nil)
	require.Equal(t, http.StatusUnauthorized, r.Status, "revoked: refused at once, %s", r.Raw)
}
