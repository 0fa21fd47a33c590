package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/staff"
)

// TestEveryAdminRouteEnforcesItsRole walks every route of the admin API with a token of
// every role: a role the route does not allow gets 403 forbidden_role and changes nothing
// (no audit row); a role it allows gets past the role check (whatever the handler answers
// to a made-up id or body), and each of its writes is an audit row. Unknown and revoked
// staff tokens get 401.
func TestEveryAdminRouteEnforcesItsRole(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{staff: true, invoices: true, webhooks: true, credits: true})
	store := staff.NewStore(b.pool)
	tokens := map[staff.Role]string{}
	for _, role := range staff.Roles {
		_, token, err := store.Create(b.ctx, "test "+string(role), role, "test")
		require.NoError(t, err)
		tokens[role] = token
	}
	audited := func() int64 {
		var n int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from audit_log`).Scan(&n))
		return n
	}
	fill := strings.NewReplacer("{id}", "x1", "{grant}", "gr_x", "{delivery}", "1", "{account}", "x1")
	walked := 0
	for _, route := range api.Routes {
		method, path, ok := strings.Cut(route, " ")
		if !ok || !strings.HasPrefix(path, "/v1/admin/") {
			continue
		}
		walked++
		for _, role := range staff.Roles {
			before := audited()
			r := b.call(t, method, fill.Replace(path), tokens[role], "{}")
			if !role.Allows(route) {
				require.Equal(t, http.StatusForbidden, r.Status, "%s as %s: %s", route, role, r.Raw)
				require.Equal(t, "forbidden_role", errCode(r), "%s as %s", route, role)
				require.Equal(t, before, audited(), "%s as %s: a refused call is not audited", route, role)
				continue
			}
			require.NotEqual(t, "forbidden_role", errCode(r), "%s as %s: %s", route, role, r.Raw)
			require.NotEqual(t, http.StatusUnauthorized, r.Status, "%s as %s: %s", route, role, r.Raw)
			if staff.IsWrite(route) {
				require.Equal(t, before+1, audited(), "%s as %s: every write is an audit row", route, role)
			}
		}
	}
	require.Greater(t, walked, 30, "every admin route")

	r := b.call(t, "GET", "/v1/admin/plans", staff.TokenPrefix+"unknown", nil)
	require.Equal(t, http.StatusUnauthorized, r.Status)
}

// A staff member's write is an audit row naming it, with what the reply says is there
// now, its secrets left out; once revoked, its token is refused.
func TestStaffWritesAreAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{staff: true})
	store := staff.NewStore(b.pool)
	m, token, err := store.Create(b.ctx, "Sam Support", staff.Support, "test")
	require.NoError(t, err)
	r := b.call(t, "POST", "/v1/admin/accounts", adminToken, map[string]any{"id": "acme", "kind": "org", "plan": "pro"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	r = b.call(t, "POST", "/v1/admin/api-keys", token, map[string]any{"account": "acme"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)

	entries, err := store.Entries(b.ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	key := entries[0]
	require.Equal(t, m.ID, key.Actor)
	require.Equal(t, staff.Support, key.Role)
	require.Equal(t, "/v1/admin/api-keys", key.Route)
	require.Equal(t, http.StatusCreated, key.Status)
	require.Contains(t, string(key.After), `"(redacted)"`)
	secret := strings.Split(strings.Split(r.Raw, `"api_key":"`)[1], `"`)[0]
	require.NotContains(t, string(key.After), secret, "the key's secret is not kept")
	require.Equal(t, staff.AdminToken, entries[1].Actor)

	require.NoError(t, store.Revoke(b.ctx, m.ID, "test"))
	r = b.call(t, "GET", "/v1/admin/plans", token, nil)
	require.Equal(t, http.StatusUnauthorized, r.Status, "a revoked token is refused at once")
}
