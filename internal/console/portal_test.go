package console_test

import (
	"encoding/json"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/console"
	"github.com/metergate/metergate/internal/customer"
)

// A link opens once into a session cookie (HttpOnly, SameSite=Lax, Secure with the
// __Host- prefix unless configured for loopback) of a customer token living an hour; a
// second opening, an expired link and a code of no link get an error page and no cookie.
func TestPortalSessionLink(t *testing.T) {
	t.Parallel()
	b := setupPortal(t)
	org, _, _, _ := b.tree(t)

	link := b.link(t, org, customer.UsageRead)
	br := b.browser(t)
	head, err := http.NewRequestWithContext(b.ctx, http.MethodHead, b.url+link, nil)
	require.NoError(t, err)
	r := br.do(head)
	require.Equal(t, http.StatusOK, r.status, "a link checker's HEAD")
	require.Empty(t, r.header.Values("Set-Cookie"), "opens nothing")
	r = br.get(link)
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.Equal(t, "/portal/", r.location)
	cookies := (&http.Response{Header: r.header}).Cookies()
	require.Len(t, cookies, 1)
	ck := cookies[0]
	require.Equal(t, "mg_portal", ck.Name, "insecure cookies: no __Host- prefix")
	require.True(t, strings.HasPrefix(ck.Value, customer.TokenPrefix))
	require.True(t, ck.HttpOnly)
	require.False(t, ck.Secure)
	require.Equal(t, http.SameSiteLaxMode, ck.SameSite)
	require.Equal(t, "/", ck.Path)
	require.InDelta(t, customer.SessionTTL.Seconds(), float64(ck.MaxAge), 5, "the cookie lives as long as its token")
	tok, err := b.customers.Authenticate(b.ctx, ck.Value)
	require.NoError(t, err)
	require.Equal(t, org, tok.Account)
	require.Equal(t, []customer.Scope{customer.UsageRead}, tok.Scopes)
	require.InDelta(t, customer.SessionTTL.Seconds(), tok.ExpiresAt.Sub(tok.CreatedAt).Seconds(), 1)

	page := br.get("/portal/")
	require.Equal(t, http.StatusOK, page.status, page.body)
	require.Contains(t, page.body, "Overview of "+org)
	require.Contains(t, page.body, `href="https://cloud.example/account?tab=usage&amp;x=%3cy%3e"`, "the Back link, escaped")
	require.Contains(t, page.body, "Back to "+testBrand)
	require.Equal(t, "no-store", page.header.Get("Cache-Control"))
	require.Contains(t, page.header.Get("Content-Security-Policy"), "default-src 'none'")

	again := b.browser(t)
	r = again.get(link)
	require.Equal(t, http.StatusNotFound, r.status, "a link opens once")
	require.Contains(t, r.body, "opened already")
	require.Empty(t, r.header.Values("Set-Cookie"))
	require.Equal(t, http.StatusUnauthorized, again.get("/portal/").status)

	expired := b.link(t, org, customer.UsageRead)
	_, err = b.pool.Exec(b.ctx, `update portal_sessions set created_at = created_at - interval '6 minutes',
		expires_at = expires_at - interval '6 minutes' where opened_at is null`)
	require.NoError(t, err)
	r = again.get(expired)
	require.Equal(t, http.StatusNotFound, r.status, "an expired link")
	require.Empty(t, r.header.Values("Set-Cookie"))
	r = again.get("/portal/session/mgp_" + strings.Repeat("A", 43))
	require.Equal(t, http.StatusNotFound, r.status, "a code of no link")

	// Over HTTPS the cookie is Secure and __Host-: a portal so configured, asked directly.
	secure := b.portalConfig
	secure.InsecureCookies = false
	rec := httptest.NewRecorder()
	console.NewPortal(secure).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, b.link(t, org, customer.UsageRead), nil))
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	set := rec.Header().Get("Set-Cookie")
	require.Regexp(t, `^__Host-mg_portal=mgc_[A-Za-z0-9_-]{43}; Path=/; Max-Age=3[0-9]{3}; HttpOnly; Secure; SameSite=Lax$`, set)

	// A customer token issued through the admin API does not sign into the portal.
	_, secret, err := b.customers.Create(b.ctx, org, []customer.Scope{customer.UsageRead}, time.Hour, "", "test")
	require.NoError(t, err)
	forged := b.browser(t)
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	forged.c.Jar.SetCookies(u, []*http.Cookie{{Name: "mg_portal", Value: secret, Path: "/"}})
	require.Equal(t, http.StatusUnauthorized, forged.get("/portal/").status)
}

// Every route but the stylesheets and the links needs a session: without one, a page is
// the "session ended" page (401) and a write is refused; a path of no page is 404.
func TestEveryPortalRouteNeedsASession(t *testing.T) {
	t.Parallel()
	b := setupPortal(t)
	anon := b.browser(t)
	fill := strings.NewReplacer("{id}", "1", "{key}", "mgk_x", "{code}", "mgp_x", "{file}", "portal.css", "{$}", "")
	for route := range console.PortalRoutes {
		method, path, _ := strings.Cut(route, " ")
		path = fill.Replace(path)
		var r page
		if method == http.MethodPost {
			r = anon.post(path, url.Values{"csrf": {"x"}})
		} else {
			r = anon.get(path)
		}
		switch route {
		case "GET /portal/static/{file}":
			require.Equal(t, http.StatusOK, r.status, route)
		case "GET /portal/session/{code}":
			require.Equal(t, http.StatusNotFound, r.status, route)
		default:
			require.False(t, console.PortalOpen[route], route)
			require.Equal(t, http.StatusUnauthorized, r.status, "%s: %s", route, r.body)
			require.Contains(t, r.body, "Your portal session has ended", route)
		}
	}
	r := b.browser(t).get("/portal/static/brand.css")
	require.Equal(t, ":root { --brand: #6f42c1; }\n", r.body)
	require.Equal(t, http.StatusNotFound, b.browser(t).get("/portal/static/nothing.css").status)
}

// Every write of the portal needs the session's CSRF token and a request of the same site:
// a forged one changes nothing.
func TestPortalWritesNeedCSRF(t *testing.T) {
	t.Parallel()
	b := setupPortal(t)
	org, team, _, _ := b.tree(t)
	br := b.session(t, org, customer.Scopes...)
	r := br.get("/portal/accounts/" + team)
	require.Equal(t, http.StatusOK, r.status, r.body)
	csrf := br.csrf
	require.NotEmpty(t, csrf)

	writes := 0
	for route := range console.PortalRoutes {
		method, path, _ := strings.Cut(route, " ")
		if method != http.MethodPost {
			continue
		}
		writes++
		path = strings.NewReplacer("{id}", team, "{key}", "mgk_x").Replace(path)
		form := url.Values{"id": {b.id("forged")}, "kind": {"team"}, "quota.requests": {"1"}}
		for _, forged := range []string{"", "not-the-token"} {
			form.Set("csrf", forged)
			r := br.post(path, form)
			require.Equal(t, http.StatusForbidden, r.status, "%s with csrf %q", route, forged)
		}
		// The right token from another site.
		form.Set("csrf", csrf)
		req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.url+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		require.Equal(t, http.StatusForbidden, br.do(req).status, "%s from another site", route)
	}
	require.Equal(t, 5, writes)

	var accounts, keys int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select (select count(*) from accounts where id = $1), (select count(*) from api_keys)`,
		b.id("forged")).Scan(&accounts, &keys))
	require.Zero(t, accounts)
	require.Zero(t, keys)
	require.Equal(t, http.StatusOK, br.get("/portal/").status, "the session was not signed out")
	status, raw := b.api(t, http.MethodGet, "/v1/admin/accounts/"+team, adminToken, nil)
	require.Equal(t, http.StatusOK, status, raw)
	var a struct {
		Limits map[string]any `json:"limits"`
	}
	require.NoError(t, json.Unmarshal([]byte(raw), &a))
	require.Empty(t, a.Limits, "no limit was set")
}

// A usage:read session shows usage, limits and what remains, the accounts below and their
// pages, and nothing of billing, keys or writes; the accounts outside its subtree are 404.
func TestPortalUsagePages(t *testing.T) {
	t.Parallel()
	b := setupPortal(t)
	org, team, user, other := b.tree(t)
	now := time.Now().UTC()
	b.used(t, use{[]string{org, team, user}, now, 1234}, use{[]string{org, team}, now, 100},
		use{[]string{org}, now.AddDate(0, -3, 0), 7}, use{[]string{other}, now, 999_999})

	br := b.session(t, org, customer.UsageRead)
	r := br.get("/portal/")
	require.Equal(t, http.StatusOK, r.status, r.body)
	for _, want := range []string{"What remains now", "Limits", "Usage this month", "The last twelve months",
		"tokens per day this month", "tokens per month", "tokens by account below", `href="/portal/accounts/` + team + `"`,
		"1\u202f334", // the team's tokens this month, in the table of accounts below
	} {
		require.Contains(t, r.body, want)
	}
	require.Regexp(t, `<svg class="chart"`, r.body)
	require.NotContains(t, r.body, "999\u202f999", "another org's usage")
	for _, absent := range []string{"Prepaid credits", "Add a team", "Save limits", "/keys", "/portal/invoices"} {
		require.NotContains(t, r.body, absent)
	}
	r = br.get("/portal/accounts/" + team)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "team "+team)
	require.Contains(t, r.body, `href="/portal/accounts/`+user+`"`)
	require.Equal(t, http.StatusSeeOther, br.get("/portal/accounts/"+org).status, "its own account is the overview")

	for _, path := range []string{"/portal/accounts/" + other, "/portal/accounts/" + b.id("nobody"), "/portal/accounts/a%00b",
		"/portal/nothing"} {
		r = br.get(path)
		require.Equal(t, http.StatusNotFound, r.status, "%s: %s", path, r.body)
		require.NotContains(t, r.body, "999\u202f999")
	}
	for _, path := range []string{"/portal/invoices", "/portal/invoices/1", "/portal/invoices/1/pdf", "/portal/credit-notes/1",
		"/portal/accounts/" + org + "/keys"} {
		r = br.get(path)
		require.Equal(t, http.StatusForbidden, r.status, path)
		require.Contains(t, r.body, "Your access does not include this page")
	}

	// A team's session sees neither its parent nor its siblings.
	sibling := b.id("ops")
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts", map[string]any{"id": sibling, "kind": "team", "parent": org})
	b.resolvable(t, sibling)
	teamSession := b.session(t, team, customer.UsageRead)
	require.Contains(t, teamSession.get("/portal/").body, "Overview of "+team)
	for _, id := range []string{org, sibling} {
		require.Equal(t, http.StatusNotFound, teamSession.get("/portal/accounts/"+id).status, id)
	}
}

var keyShown = regexp.MustCompile(`<code>(mgk_[A-Za-z0-9_-]+)</code>`)

// A keys:write session creates an API key (its secret shown once) and revokes it; another
// org's key is 404.
func TestPortalKeys(t *testing.T) {
	t.Parallel()
	b := setupPortal(t)
	org, team, _, other := b.tree(t)
	br := b.session(t, org, customer.KeysWrite)
	r := br.get("/portal/")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `href="/portal/accounts/`+org+`/keys"`)
	require.NotContains(t, r.body, "What remains now")

	r = br.get("/portal/accounts/" + team + "/keys")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "No API keys")
	r = br.post("/portal/accounts/"+team+"/keys", nil)
	require.Equal(t, http.StatusCreated, r.status, r.body)
	m := keyShown.FindStringSubmatch(r.body)
	require.NotNil(t, m, r.body)
	page := br.get("/portal/accounts/" + team + "/keys")
	require.NotContains(t, page.body, m[1], "the secret is shown once")
	id := regexp.MustCompile(`/keys/(key_[0-9a-f]{16})/revoke`).FindStringSubmatch(page.body)
	require.NotNil(t, id, page.body)
	r = br.post("/portal/accounts/"+team+"/keys/"+id[1]+"/revoke", nil)
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.NotContains(t, br.get("/portal/accounts/"+team+"/keys").body, "/revoke", "revoked")

	otherKey := b.apiKeyOf(t, other)
	r = br.post("/portal/accounts/"+team+"/keys/"+otherKey+"/revoke", nil)
	require.Equal(t, http.StatusNotFound, r.status, r.body)
	require.Equal(t, http.StatusNotFound, br.get("/portal/accounts/"+other+"/keys").status)
	var revoked bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `select revoked_at is not null from api_keys where id = $1`, otherKey).Scan(&revoked))
	require.False(t, revoked, "another org's key stays")
}

// apiKeyOf makes an API key of account through the admin API and returns its id.
func (b *portalBundle) apiKeyOf(t *testing.T, account string) string {
	t.Helper()
	status, raw := b.api(t, http.MethodPost, "/v1/admin/api-keys", adminToken, map[string]string{"account": account})
	require.Equal(t, http.StatusCreated, status, raw)
	m := regexp.MustCompile(`"id":"([^"]+)"`).FindStringSubmatch(raw)
	require.NotNil(t, m, raw)
	return m[1]
}

// An accounts:write session adds a team below its org and sets the team's limits, within
// the org's: a quota above it is refused.
func TestPortalTeams(t *testing.T) {
	t.Parallel()
	b := setupPortal(t)
	org, _, _, _ := b.tree(t)
	br := b.session(t, org, customer.UsageRead, customer.AccountsWrite)
	r := br.get("/portal/")
	require.Contains(t, r.body, "Add a team, user or agent below "+org)
	require.NotContains(t, r.body, "Save limits", "its own account's limits are the operator's")

	team := b.id("research")
	r = br.post("/portal/accounts/"+org+"/children", url.Values{"id": {team}, "kind": {"team"}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.Equal(t, "/portal/accounts/"+team, r.location)
	b.resolvable(t, team)
	r = br.get(r.location)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "Limits of "+team)

	r = br.post("/portal/accounts/"+team+"/limits", url.Values{"quota.requests": {"100"}, "period.requests": {"month"}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	quota := regexp.MustCompile(`<td>` + team + `</td><td>requests</td><td>[^<]*</td>\s*<td class="n">100</td>`)
	require.Regexp(t, quota, br.get("/portal/accounts/"+team).body, "the team's quota shows")
	r = br.post("/portal/accounts/"+team+"/limits", url.Values{"quota.requests": {"5000"}, "period.requests": {"month"}})
	require.Equal(t, http.StatusBadRequest, r.status, "above the org's 1000: %s", r.body)

	usageOnly := b.session(t, org, customer.UsageRead)
	usageOnly.get("/portal/")
	r = usageOnly.post("/portal/accounts/"+team+"/limits", url.Values{"quota.requests": {"1"}})
	require.Equal(t, http.StatusForbidden, r.status, "no accounts:write")
}

// A billing:read session shows the balance with the top-up link, the org's invoices and
// credit notes, an invoice's page and its PDF; another org's invoice is 404.
func TestPortalBilling(t *testing.T) {
	t.Parallel()
	b := setupPortal(t)
	inv := b.invoiced(t, "Acme Widgets GmbH") // an org b.id("acme") on plan pro, its March invoiced
	org := inv.Org
	b.resolvable(t, org)
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts/"+org+"/grants",
		map[string]any{"unit": "credits", "amount": 5000, "source": "purchase", "idempotency_key": "test-grant"})

	br := b.session(t, org, customer.BillingRead)
	r := br.get("/portal/")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "Prepaid credits")
	require.Contains(t, r.body, "5\u202f000")
	require.Contains(t, r.body, `href="`+html.EscapeString(strings.ReplaceAll(testTopUp, "{account}", org))+`"`)
	require.NotContains(t, r.body, "What remains now")

	r = br.get("/portal/invoices")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, inv.Number)
	id := strconv.FormatInt(inv.ID, 10)
	r = br.get("/portal/invoices/" + id)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "Acme Widgets GmbH")
	pdf := br.get("/portal/invoices/" + id + "/pdf")
	require.Equal(t, http.StatusOK, pdf.status, pdf.body)
	require.Equal(t, "application/pdf", pdf.header.Get("Content-Type"))
	require.True(t, strings.HasPrefix(pdf.body, "%PDF-"))

	b.adminCall(t, http.MethodPost, "/v1/admin/invoices/"+id+"/void", map[string]string{"reason": "Billed twice"})
	r = br.get("/portal/invoices")
	note := regexp.MustCompile(`href="/portal/credit-notes/([0-9]+)"`).FindStringSubmatch(r.body)
	require.NotNil(t, note, r.body)
	r = br.get("/portal/credit-notes/" + note[1])
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "Billed twice")
	pdf = br.get("/portal/credit-notes/" + note[1] + "/pdf")
	require.Equal(t, http.StatusOK, pdf.status)
	require.True(t, strings.HasPrefix(pdf.body, "%PDF-"))

	// Another org's session finds none of it.
	other := b.id("globex")
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts", map[string]any{"id": other, "kind": "org", "plan": "pro"})
	b.resolvable(t, other)
	stranger := b.session(t, other, customer.BillingRead)
	require.NotContains(t, stranger.get("/portal/invoices").body, inv.Number)
	for _, path := range []string{"/portal/invoices/" + id, "/portal/invoices/" + id + "/pdf", "/portal/credit-notes/" + note[1],
		"/portal/accounts/" + org} {
		require.Equal(t, http.StatusNotFound, stranger.get(path).status, path)
	}
}

// Signing out revokes the session's token and clears its cookie: the next page is the
// "session ended" page, and the token opens nothing of the customer API either.
func TestPortalSignOut(t *testing.T) {
	t.Parallel()
	b := setupPortal(t)
	org, _, _, _ := b.tree(t)
	br := b.session(t, org, customer.UsageRead)
	r := br.get("/portal/")
	require.Equal(t, http.StatusOK, r.status)
	tokens, err := b.customers.List(b.ctx, customer.Filter{Account: org})
	require.NoError(t, err)
	require.Len(t, tokens, 1)

	r = br.post("/portal/sign-out", nil)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "You have signed out")
	require.Contains(t, r.body, "Back to "+testBrand)
	require.Regexp(t, `mg_portal=; Path=/; Max-Age=0`, r.header.Get("Set-Cookie"))
	got, err := b.customers.Get(b.ctx, tokens[0].ID)
	require.NoError(t, err)
	require.NotNil(t, got.RevokedAt, "the token is revoked")
	require.Equal(t, tokens[0].ID, got.RevokedBy, "by itself")
	r = br.get("/portal/")
	require.Equal(t, http.StatusUnauthorized, r.status)
	require.Contains(t, r.body, "Your portal session has ended. Open the portal again from "+testBrand)
}
