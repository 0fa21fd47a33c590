package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/console"
	"github.com/metergate/metergate/internal/staff"
)

// TestSignInAndOut: a staff token or the admin token opens a session; anything else is
// refused; signing out, revoking the member and the session's end each close it.
func TestSignInAndOut(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	m, token := b.member(t, staff.Viewer)

	anon := b.browser(t)
	r := anon.get("/console/accounts")
	require.Equal(t, http.StatusSeeOther, r.status)
	require.Equal(t, "/console/login?next=%2Fconsole%2Faccounts", r.location)
	anon.get("/console/login")
	r = anon.post("/console/login", url.Values{"token": {"mgs_not-a-token"}})
	require.Equal(t, http.StatusUnauthorized, r.status)
	require.Contains(t, r.body, "not a live staff or admin token")
	r = anon.post("/console/login", url.Values{"token": {token}, "csrf": {"forged"}})
	require.Equal(t, http.StatusForbidden, r.status, "the login form's CSRF token is checked")

	admin := b.signedIn(t, adminToken)
	require.Equal(t, http.StatusOK, admin.get("/console/accounts").status)

	viewer := b.signedIn(t, token)
	r = viewer.get("/console/accounts")
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, m.Name)
	r = viewer.post("/console/logout", nil)
	require.Equal(t, http.StatusSeeOther, r.status)
	require.Equal(t, http.StatusSeeOther, viewer.get("/console/accounts").status, "signed out")

	// A revoked member's sessions end with it.
	viewer = b.signedIn(t, token)
	require.NoError(t, b.staff.Revoke(b.ctx, m.ID, "test"))
	require.Equal(t, http.StatusSeeOther, viewer.get("/console/accounts").status, "revoked member")

	// An expired session is refused.
	_, token = b.member(t, staff.Support)
	support := b.signedIn(t, token)
	_, err := b.pool.Exec(b.ctx, `update console_sessions set created_at = now() - interval '1 hour', expires_at = now() - interval '59 minutes' where staff_id <> 'admin-token' and revoked_at is null`)
	require.NoError(t, err)
	require.Equal(t, http.StatusSeeOther, support.get("/console/accounts").status, "expired session")
	require.Equal(t, http.StatusOK, admin.get("/console/accounts").status, "the admin's session is live still")
}

// TestEveryPageSendsTheSecurityHeaders: no script, no framing, no caching, no sniffing.
func TestEveryPageSendsTheSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	br := b.signedIn(t, adminToken)
	for _, path := range []string{"/console/login", "/console/", "/console/accounts", "/console/nope"} {
		r := br.get(path)
		csp := r.header.Get("Content-Security-Policy")
		require.Contains(t, csp, "default-src 'none'", path)
		require.Contains(t, csp, "frame-ancestors 'none'", path)
		require.NotContains(t, csp, "script-src", path)
		require.Equal(t, "DENY", r.header.Get("X-Frame-Options"), path)
		require.Equal(t, "nosniff", r.header.Get("X-Content-Type-Options"), path)
		require.Equal(t, "no-store", r.header.Get("Cache-Control"), path)
		require.NotContains(t, r.body, "<script", path)
	}
}

// TestSessionCookie: HttpOnly, SameSite=Strict, and Secure with the __Host- prefix unless
// configured for loopback.
func TestSessionCookie(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	br := b.browser(t)
	br.get("/console/login")
	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.url+"/console/login",
		strings.NewReader(url.Values{"token": {adminToken}, "csrf": {br.csrf}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := br.c.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	var found bool
	for _, c := range res.Cookies() {
		if c.Name == "mg_console" && c.MaxAge > 0 {
			found = true
			require.True(t, c.HttpOnly)
			require.Equal(t, http.SameSiteStrictMode, c.SameSite)
			require.Len(t, c.Value, 43)
		}
	}
	require.True(t, found, "the session cookie is set")
}

// TestWritesNeedTheCSRFTokenAndTheSameSite: a write without the session's token, or sent
// from another site, changes nothing.
func TestWritesNeedTheCSRFTokenAndTheSameSite(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	br := b.signedIn(t, adminToken)
	br.get("/console/accounts")
	org := b.id("org")
	r := br.post("/console/accounts", url.Values{"id": {org}, "kind": {"org"}, "csrf": {"forged"}})
	require.Equal(t, http.StatusForbidden, r.status)
	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.url+"/console/accounts",
		strings.NewReader(url.Values{"id": {org}, "kind": {"org"}, "csrf": {br.csrf}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	require.Equal(t, http.StatusForbidden, br.do(req).status)
	require.Equal(t, http.StatusNotFound, br.get("/console/accounts/"+org).status, "nothing was created")

	r = br.post("/console/accounts", url.Values{"id": {org}, "kind": {"org"}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.Equal(t, http.StatusOK, br.get("/console/accounts/"+org).status)
}

// TestEveryRouteEnforcesItsRole walks every route of the console with every role: a page
// opens for each role without a 5xx; a write the role may not do is 403 and leaves no
// audit row; without a session a page sends to the sign-in page and a write is 401.
func TestEveryRouteEnforcesItsRole(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	browsers := map[staff.Role]*browser{}
	for _, role := range staff.Roles {
		_, token := b.member(t, role)
		browsers[role] = b.signedIn(t, token)
	}
	audited := func() int64 {
		var n int64
		require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from audit_log`).Scan(&n))
		return n
	}
	fill := strings.NewReplacer("{id}", "x1", "{key}", "k1", "{delivery}", "1", "{file}", "console.css", "{$}", "")
	anon := b.browser(t)
	anon.get("/console/login")
	walked := 0
	for _, route := range console.Routes {
		method, path, _ := strings.Cut(route, " ")
		path = fill.Replace(path)
		walked++
		if !console.Open[route] {
			if method == http.MethodGet {
				r := anon.get(path)
				require.Equal(t, http.StatusSeeOther, r.status, route)
				require.True(t, strings.HasPrefix(r.location, "/console/login"), route)
			} else {
				require.Equal(t, http.StatusUnauthorized, anon.post(path, url.Values{"csrf": {anon.csrf}}).status, route)
			}
		}
		for _, role := range staff.Roles {
			br := browsers[role]
			if method == http.MethodGet {
				r := br.get(path)
				require.Less(t, r.status, 500, "%s as %s: %s", route, role, r.body)
				continue
			}
			if console.Open[route] {
				continue
			}
			before := audited()
			br.get("/console/accounts") // a fresh CSRF token
			r := br.post(path, url.Values{})
			if !role.Allows(console.Writes[route]) {
				require.Equal(t, http.StatusForbidden, r.status, "%s as %s: %s", route, role, r.body)
				require.Equal(t, before, audited(), "%s as %s: a refused write changes nothing", route, role)
				continue
			}
			require.NotEqual(t, http.StatusForbidden, r.status, "%s as %s: %s", route, role, r.body)
			require.Less(t, r.status, 500, "%s as %s: %s", route, role, r.body)
		}
	}
	require.Equal(t, len(console.Routes), walked)
	for w := range console.Writes {
		require.Contains(t, console.Routes, w, "every write is a route")
	}
}
