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

// portalSession is the reply of POST /v1/admin/portal-sessions.
type portalSession struct {
	ID        string           `json:"id"`
	Account   string           `json:"account"`
	Org       string           `json:"org"`
	Scopes    []customer.Scope `json:"scopes"`
	ReturnURL string           `json:"return_url"`
	CreatedAt time.Time        `json:"created_at"`
	CreatedBy string           `json:"created_by"`
	ExpiresAt time.Time        `json:"expires_at"`
	URL       string           `json:"url"`
}

// An admin or support asks for a portal session's link of an account: the link's code is
// shown once, opens a session of the account and scopes asked for, and lives 5 minutes;
// finance and viewers may not; the request is validated; its audit row keeps no link.
func TestPortalSessionRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{staff: true, customers: true})
	org, team := b.id("org"), b.id("team")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	b.account(t, map[string]any{"id": team, "kind": "team", "parent": org})
	sam := b.addStaff(t, adminToken, "Sam Support", staff.Support)
	fiona := b.addStaff(t, adminToken, "Fiona Finance", staff.Finance)
	store := customer.NewStore(b.pool)

	body := map[string]any{"account": team, "scopes": []string{"keys:write", "usage:read", "keys:write"},
		"return_url": "https://cloud.example/settings?tab=team#keys"}
	r := b.call(t, "POST", "/v1/admin/portal-sessions", sam.Token, body)
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	var s portalSession
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &s))
	require.Regexp(t, `^ps_[0-9a-f]{16}$`, s.ID)
	require.Equal(t, team, s.Account)
	require.Equal(t, org, s.Org)
	require.Equal(t, []customer.Scope{customer.UsageRead, customer.KeysWrite}, s.Scopes)
	require.Equal(t, "https://cloud.example/settings?tab=team#keys", s.ReturnURL)
	require.Equal(t, sam.ID, s.CreatedBy)
	require.Equal(t, customer.LinkTTL, s.ExpiresAt.Sub(s.CreatedAt))
	require.Regexp(t, `^/portal/session/mgp_[A-Za-z0-9_-]{43}$`, s.URL, "a path when PORTAL_PUBLIC_URL is empty")
	code := strings.TrimPrefix(s.URL, "/portal/session/")
	_, tok, _, err := store.OpenSession(b.ctx, code)
	require.NoError(t, err, "the link's code opens the session")
	require.Equal(t, team, tok.Account)
	require.Equal(t, s.Scopes, tok.Scopes)

	r = b.call(t, "POST", "/v1/admin/portal-sessions", adminToken, map[string]any{"account": org, "scopes": []string{"billing:read"},
		"return_url": "http://localhost:3000/"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	for _, role := range []staff.Role{staff.Finance, staff.Viewer} {
		token := fiona.Token
		if role == staff.Viewer {
			token = b.addStaff(t, adminToken, "Vic Viewer", staff.Viewer).Token
		}
		r = b.call(t, "POST", "/v1/admin/portal-sessions", token, body)
		require.Equal(t, http.StatusForbidden, r.Status, "%s: %s", role, r.Raw)
		require.Equal(t, "forbidden_role", errCode(r))
	}

	for _, tt := range []struct {
		name string
		body any
		code string
	}{
		{"relative return_url", map[string]any{"account": org, "scopes": []string{"usage:read"}, "return_url": "/account"}, "invalid_return_url"},
		{"javascript", map[string]any{"account": org, "scopes": []string{"usage:read"}, "return_url": "javascript:alert(1)"}, "invalid_return_url"},
		{"user info", map[string]any{"account": org, "scopes": []string{"usage:read"}, "return_url": "https://a:b@cloud.example/"}, "invalid_return_url"},
		{"no return_url", map[string]any{"account": org, "scopes": []string{"usage:read"}}, "invalid_return_url"},
		{"no scopes", map[string]any{"account": org, "return_url": "https://cloud.example/"}, "invalid_scope"},
		{"unknown scope", map[string]any{"account": org, "scopes": []string{"admin"}, "return_url": "https://cloud.example/"}, "invalid_scope"},
		{"bad account", map[string]any{"account": "a/b", "scopes": []string{"usage:read"}, "return_url": "https://cloud.example/"}, "invalid_account"},
		{"a ttl", map[string]any{"account": org, "scopes": []string{"usage:read"}, "return_url": "https://cloud.example/", "ttl_s": 60}, "unknown_field"},
	} {
		r = b.call(t, "POST", "/v1/admin/portal-sessions", sam.Token, tt.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", tt.name, r.Raw)
		require.Equal(t, tt.code, errCode(r), tt.name)
	}
	r = b.call(t, "POST", "/v1/admin/portal-sessions", sam.Token, map[string]any{"account": b.id("nobody"),
		"scopes": []string{"usage:read"}, "return_url": "https://cloud.example/"})
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)

	entries, _ := b.audit(t, "actor="+sam.ID)
	var made []staff.Entry
	for _, e := range entries {
		if e.Route == "/v1/admin/portal-sessions" && e.Status == http.StatusCreated {
			made = append(made, e)
		}
	}
	require.Len(t, made, 1)
	var after map[string]any
	require.NoError(t, json.Unmarshal(made[0].After, &after))
	require.Equal(t, s.ID, after["id"])
	require.Equal(t, "(redacted)", after["url"], "the link is not kept")
	require.NotContains(t, string(made[0].After), code)
	require.NotContains(t, string(made[0].After), strings.TrimPrefix(code, customer.LinkPrefix))
}

// Without a store of customer tokens the route answers 503.
func TestPortalSessionsWithoutAStore(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true})
	r := b.call(t, "POST", "/v1/admin/portal-sessions", adminToken,
		map[string]any{"account": "acme", "scopes": []string{"usage:read"}, "return_url": "https://cloud.example/"})
	require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Raw)
	require.Equal(t, "unavailable", errCode(r))
}
