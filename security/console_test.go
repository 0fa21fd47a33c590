package security_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/console"
)

// Finding 15: the web console. Its pages run no script and cannot be framed, its cookies
// stay out of scripts and other sites, a write needs the session's CSRF token from the same
// site and the role the admin API route it performs asks for, a session ends when it is
// signed out, revoked, expired or its member revoked, and free text is escaped.
func consoleProbes() []probe {
	return []probe{
		{name: "F15-console-headers", desc: "every console page (sign-in, overview, accounts, an account, why, invoices, audit, a 404): a CSP with default-src 'none', frame-ancestors 'none' and no script source; X-Frame-Options DENY, nosniff, Cache-Control no-store; no <script; the sign-in and session cookies HttpOnly, Secure, SameSite=Strict, the session's __Host- with Path=/",
			run: consoleHeaders},
		{name: "F15-console-csrf", desc: "an admin's POST /console/accounts without the CSRF token, with a wrong one or another session's, or sent with Sec-Fetch-Site cross-site/same-site or Origin http://evil.example: 403, no account in PostgreSQL; with its token from the same site: 303 and the account; a sign-in without its double-submit cookie or from another site: 403, no session",
			run: consoleCSRF},
		{name: "F15-console-roles", desc: "a viewer's session with its CSRF token: every console write (console.Writes) 403; no audit row, account, key revocation, member or ended session; every POST route of the console but signing in and out is in console.Writes",
			run: consoleRoles},
		{name: "F15-console-session-end", desc: "a session signed out, ended by an admin, expired, or of a revoked member, and forged cookies: a page 303 to /console/login, a write 401 and nothing written, on both admit nodes",
			run: consoleSessionEnd},
		{name: "F15-console-escape", desc: "a customer's legal name <img src=x onerror=alert(1)> (PUT /v1/admin/accounts/{org}/billing) found by the console's search is shown escaped (&lt;img), never raw; an account id with markup is 400 at the API and the console, and its page a 404, neither echoing it raw",
			run: consoleEscape},
	}
}

const (
	// sessionCookie is the console's session cookie on a deployment without
	// CONSOLE_INSECURE_COOKIES, the one the stack runs.
	sessionCookie = "__Host-mg_console"
	// loginCookie is the sign-in form's double-submit cookie.
	loginCookie = "mg_console_login"
)

// browser is the stack's client that does not follow redirects: a console's 303 is part of
// its answer. Cookies are handled by hand, since a cookie jar sends no Secure cookie over
// plain HTTP.
var browser = &http.Client{Timeout: client.Timeout, Transport: client.Transport,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// visit sends a console request with the cookies given ("name=value" each) and, when form
// is not nil, the form as its body; headers are added as they are.
func visit(p *P, method, target string, cookies []string, form url.Values, header ...[2]string) answer {
	p.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(p.Context(), method, target, body)
	require.NoError(p, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if len(cookies) > 0 {
		req.Header.Set("Cookie", strings.Join(cookies, "; "))
	}
	for _, h := range header {
		req.Header.Add(h[0], h[1])
	}
	resp, err := browser.Do(req)
	require.NoError(p, err, "%s %s", method, target)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(p, err, "%s %s", method, target)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(raw)}
}

// setCookie is the cookie name of a's Set-Cookie headers (nil when there is none).
func setCookie(p *P, a answer, name string) *http.Cookie {
	p.Helper()
	for _, line := range a.header.Values("Set-Cookie") {
		c, err := http.ParseSetCookie(line)
		require.NoError(p, err, "Set-Cookie: %s", line)
		if c.Name == name {
			return c
		}
	}
	return nil
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrfOf is the CSRF token of the first form of a page.
func csrfOf(p *P, a answer) string {
	p.Helper()
	m := csrfField.FindStringSubmatch(a.body)
	require.NotNil(p, m, "no CSRF field in the page: %s", a.String())
	return m[1]
}

// sameSite is what a browser sends with a form of the console's own page.
func sameSite(base string) [][2]string {
	return [][2]string{{"Sec-Fetch-Site", "same-origin"}, {"Origin", base}}
}

// consoleSession is a signed-in browser: the admit node it signed in at, its session
// cookie's value and its CSRF token; loginPage and signIn are the answers that set its
// cookies.
type consoleSession struct {
	base, cookie, csrf string
	loginPage, signIn  answer
}

// signInAt signs in at the console of base with token, as a browser does.
func signInAt(p *P, base, token string) consoleSession {
	p.Helper()
	page := visit(p, http.MethodGet, base+"/console/login", nil, nil)
	require.Equal(p, http.StatusOK, page.status, page.body)
	lc := setCookie(p, page, loginCookie)
	require.NotNil(p, lc, "the sign-in page sets %s: %s", loginCookie, page.String())
	in := visit(p, http.MethodPost, base+"/console/login", []string{loginCookie + "=" + lc.Value},
		url.Values{"token": {token}, "csrf": {csrfOf(p, page)}}, sameSite(base)...)
	require.Equal(p, http.StatusSeeOther, in.status, "sign in: %s", in.String())
	sc := setCookie(p, in, sessionCookie)
	require.NotNil(p, sc, "signing in sets %s: %s", sessionCookie, in.String())
	s := consoleSession{base: base, cookie: sc.Value, loginPage: page, signIn: in}
	home := s.get(p, base, "/console/")
	require.Equal(p, http.StatusOK, home.status, "the overview after signing in: %s", home.body)
	s.csrf = csrfOf(p, home)
	return s
}

// cookies is the Cookie header's value of the session.
func (s consoleSession) cookies() []string { return []string{sessionCookie + "=" + s.cookie} }

// get is a GET of path at the admit node base with the session's cookie.
func (s consoleSession) get(p *P, base, path string) answer {
	p.Helper()
	return visit(p, http.MethodGet, base+path, s.cookies(), nil)
}

// post is a form of the session, with its CSRF token, sent from the console's own page at
// the admit node base.
func (s consoleSession) post(p *P, base, path string, form url.Values) answer {
	p.Helper()
	f := url.Values{"csrf": {s.csrf}}
	for k, v := range form {
		f[k] = v
	}
	return visit(p, http.MethodPost, base+path, s.cookies(), f, sameSite(base)...)
}

// hash is the session's id as PostgreSQL and the sessions page know it.
func (s consoleSession) hash() []byte {
	h := sha256.Sum256([]byte(s.cookie))
	return h[:]
}

// connect opens a connection to the stack's database for the probe.
func (s *stack) connect(p *P) (context.Context, *pgx.Conn) {
	p.Helper()
	ctx, cancel := context.WithTimeout(p.Context(), time.Minute)
	p.Cleanup(cancel)
	conn, err := pgx.Connect(ctx, s.databaseURL())
	require.NoError(p, err)
	p.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	return ctx, conn
}

// accountsIn are those of ids that are accounts.
func accountsIn(p *P, ctx context.Context, conn *pgx.Conn, ids []string) []string {
	p.Helper()
	rows, err := conn.Query(ctx, `select id from accounts where id = any($1) order by id`, ids)
	require.NoError(p, err)
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(p, err)
	return found
}

// pageProblems are what a console page's answer lacks of the console's headers, and any
// script in it.
func pageProblems(what string, a answer) []string {
	var bad []string
	if csps := a.header.Values("Content-Security-Policy"); len(csps) != 1 {
		bad = append(bad, fmt.Sprintf("%s: %d Content-Security-Policy headers, want 1", what, len(csps)))
	} else {
		directives := map[string]string{}
		for _, d := range strings.Split(csps[0], ";") {
			if f := strings.Fields(d); len(f) > 0 {
				directives[strings.ToLower(f[0])] = strings.Join(f[1:], " ")
			}
		}
		for _, name := range []string{"default-src", "frame-ancestors"} {
			if directives[name] != "'none'" {
				bad = append(bad, fmt.Sprintf("%s: CSP %s is %q, want 'none' (%s)", what, name, directives[name], csps[0]))
			}
		}
		for _, name := range []string{"script-src", "script-src-elem", "script-src-attr", "worker-src"} {
			if v, ok := directives[name]; ok && v != "'none'" {
				bad = append(bad, fmt.Sprintf("%s: CSP allows scripts: %s %s", what, name, v))
			}
		}
	}
	for name, want := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"} {
		if got := a.header.Get(name); !strings.EqualFold(got, want) {
			bad = append(bad, fmt.Sprintf("%s: %s %q, want %q", what, name, got, want))
		}
	}
	if strings.Contains(strings.ToLower(a.body), "<script") {
		bad = append(bad, what+": a <script in the page")
	}
	return bad
}

// cookieProblems are what a console cookie lacks: HttpOnly, Secure, SameSite=Strict.
func cookieProblems(what string, c *http.Cookie) []string {
	var bad []string
	if !c.HttpOnly {
		bad = append(bad, what+" not HttpOnly")
	}
	if !c.Secure {
		bad = append(bad, what+" not Secure")
	}
	if c.SameSite != http.SameSiteStrictMode {
		bad = append(bad, what+" not SameSite=Strict")
	}
	return bad
}

func consoleHeaders(p *P, s *stack) {
	org := s.id("console-headers")
	s.org(p, org, "pro", nil)
	admin := signInAt(p, s.admit, adminToken)

	var bad []string
	bad = append(bad, pageProblems("GET /console/login", admin.loginPage)...)
	bad = append(bad, pageProblems("POST /console/login", admin.signIn)...)
	for _, path := range []string{"/console/", "/console/accounts", "/console/accounts/" + org, "/console/why",
		"/console/invoices", "/console/audit", "/console/nope"} {
		a := admin.get(p, s.admit, path)
		want := http.StatusOK
		if path == "/console/nope" {
			want = http.StatusNotFound
		}
		if a.status != want {
			bad = append(bad, fmt.Sprintf("GET %s: %d, want %d", path, a.status, want))
		}
		bad = append(bad, pageProblems("GET "+path, a)...)
	}

	bad = append(bad, cookieProblems(loginCookie, setCookie(p, admin.loginPage, loginCookie))...)
	for _, line := range admin.signIn.header.Values("Set-Cookie") {
		c, err := http.ParseSetCookie(line)
		require.NoError(p, err, line)
		bad = append(bad, cookieProblems("the sign-in's "+c.Name, c)...)
	}
	sc := setCookie(p, admin.signIn, sessionCookie)
	if sc.Path != "/" || sc.Domain != "" {
		bad = append(bad, fmt.Sprintf("%s: Path %q and Domain %q, want / and none", sessionCookie, sc.Path, sc.Domain))
	}
	if sc.MaxAge <= 0 || len(sc.Value) < 43 {
		bad = append(bad, fmt.Sprintf("%s: Max-Age %d, a value of %d characters", sessionCookie, sc.MaxAge, len(sc.Value)))
	}
	none(p, bad, "the console's pages or cookies lack their protections")
}

func consoleCSRF(p *P, s *stack) {
	admin := signInAt(p, s.admit, adminToken)
	other := signInAt(p, s.admit, adminToken)
	require.NotEqual(p, admin.csrf, other.csrf, "each session has its own CSRF token")
	ctx, conn := s.connect(p)

	create := func(id, csrf string, header ...[2]string) answer {
		form := url.Values{"id": {id}, "kind": {"org"}, "plan": {"pro"}}
		if csrf != "" {
			form.Set("csrf", csrf)
		}
		return visit(p, http.MethodPost, s.admit+"/console/accounts", admin.cookies(), form, header...)
	}
	var bad, refused []string
	for i, c := range []struct {
		what, csrf string
		header     [][2]string
	}{
		{"no CSRF token", "", sameSite(s.admit)},
		{"a wrong CSRF token", "forged-" + s.run, sameSite(s.admit)},
		{"another session's CSRF token", other.csrf, sameSite(s.admit)},
		{"Sec-Fetch-Site: cross-site", admin.csrf, [][2]string{{"Sec-Fetch-Site", "cross-site"}}},
		{"Sec-Fetch-Site: same-site", admin.csrf, [][2]string{{"Sec-Fetch-Site", "same-site"}}},
		{"Origin: http://evil.example", admin.csrf, [][2]string{{"Origin", "http://evil.example"}}},
		{"Sec-Fetch-Site: cross-site, Origin: http://evil.example", admin.csrf,
			[][2]string{{"Sec-Fetch-Site", "cross-site"}, {"Origin", "http://evil.example"}}},
	} {
		id := s.id(fmt.Sprintf("console-csrf-%d", i))
		refused = append(refused, id)
		if a := create(id, c.csrf, c.header...); a.status != http.StatusForbidden {
			bad = append(bad, fmt.Sprintf("%s: %d, want 403", c.what, a.status))
		}
	}
	if made := accountsIn(p, ctx, conn, refused); len(made) > 0 {
		bad = append(bad, "accounts created by refused forms: "+strings.Join(made, ", "))
	}

	// The sign-in form: its token must match its cookie, from the console's own page.
	page := visit(p, http.MethodGet, s.admit+"/console/login", nil, nil)
	lc := setCookie(p, page, loginCookie)
	require.NotNil(p, lc, page.String())
	token := csrfOf(p, page)
	for _, c := range []struct {
		what    string
		cookies []string
		csrf    string
		header  [][2]string
	}{
		{"sign-in without its cookie", nil, token, sameSite(s.admit)},
		{"sign-in with another token than its cookie's", []string{loginCookie + "=" + lc.Value}, "forged-" + s.run, sameSite(s.admit)},
		{"sign-in from another site", []string{loginCookie + "=" + lc.Value}, token, [][2]string{{"Sec-Fetch-Site", "cross-site"}}},
	} {
		a := visit(p, http.MethodPost, s.admit+"/console/login", c.cookies, url.Values{"token": {adminToken}, "csrf": {c.csrf}}, c.header...)
		if a.status != http.StatusForbidden || setCookie(p, a, sessionCookie) != nil {
			bad = append(bad, fmt.Sprintf("%s: %d, session cookie set: %t", c.what, a.status, setCookie(p, a, sessionCookie) != nil))
		}
	}
	none(p, bad, "a forged console form was not refused")

	// The right token from the same site works: the refusals above are the CSRF check's.
	id := s.id("console-csrf-ok")
	a := create(id, admin.csrf, sameSite(s.admit)...)
	require.Equal(p, http.StatusSeeOther, a.status, "the admin's own form: %s", a.String())
	require.Equal(p, []string{id}, accountsIn(p, ctx, conn, []string{id}), "the admin's own form creates the account")
}

func consoleRoles(p *P, s *stack) {
	var unlisted []string
	for _, route := range console.Routes {
		if strings.HasPrefix(route, http.MethodPost+" ") && !console.Open[route] && console.Writes[route] == "" {
			unlisted = append(unlisted, route)
		}
	}
	none(p, unlisted, "console writes missing from console.Writes (and from this probe)")

	org := s.id("console-roles")
	s.org(p, org, "pro", map[string]any{"requests": map[string]any{"quota": 100}})
	k := post(p, s.admit+"/v1/admin/api-keys", adminToken, map[string]any{"account": org})
	require.Equal(p, http.StatusCreated, k.status, k.body)
	keyID, _ := k.json["id"].(string)
	require.NotEmpty(p, keyID, k.body)
	victim := s.staff(p, "console victim", "support")
	viewer := s.staff(p, "console viewer", "viewer")
	admin := signInAt(p, s.admit, adminToken)
	session := signInAt(p, s.admit, viewer.token)
	account := func() string {
		a := do(p, http.MethodGet, s.admit+"/v1/admin/accounts/"+org, [][2]string{bearer(adminToken)}, nil)
		require.Equal(p, http.StatusOK, a.status, a.body)
		return a.body
	}
	was := account()

	newOrg, escalated := s.id("console-roles-new"), "escalated "+s.run
	forms := map[string]url.Values{
		"POST /console/accounts":              {"id": {newOrg}, "kind": {"org"}, "plan": {"pro"}},
		"POST /console/accounts/{id}":         {"plan": {"enterprise"}, "quota.requests": {"1000000"}, "period.requests": {"month"}},
		"POST /console/invoices/{id}/void":    {"reason": {"probe"}},
		"POST /console/invoices/{id}/reissue": {"reason": {"probe"}},
		"POST /console/staff":                 {"name": {escalated}, "role": {"admin"}},
	}
	// An invoice or a webhook delivery of the probe's own would need a month closed or a
	// webhook delivered; these ids name none, so a write let through would be a 404, not 403.
	ids := map[string]string{"accounts": org, "invoices": "999999999", "webhooks": "999999999",
		"staff": victim.id, "sessions": hex.EncodeToString(admin.hash())}
	routes := make([]string, 0, len(console.Writes))
	for route := range console.Writes {
		routes = append(routes, route)
	}
	slices.Sort(routes)
	var let []string
	for _, route := range routes {
		path := strings.TrimPrefix(route, http.MethodPost+" ")
		section, _, _ := strings.Cut(strings.TrimPrefix(path, "/console/"), "/")
		path = strings.NewReplacer("{id}", ids[section], "{key}", keyID, "{delivery}", "999999999").Replace(path)
		if a := session.post(p, s.admit, path, forms[route]); a.status != http.StatusForbidden {
			let = append(let, fmt.Sprintf("%s (%s): %d", route, path, a.status))
		}
	}
	none(p, let, "a viewer's console writes not refused 403")

	ctx, conn := s.connect(p)
	var changed []string
	for _, q := range []struct {
		what, sql string
		args      []any
	}{
		{"audit rows of the viewer but its sign-in", `select count(*) from audit_log where actor = $1 and route <> '/console/login'`, []any{viewer.id}},
		{"accounts created", `select count(*) from accounts where id = $1`, []any{newOrg}},
		{"the API key revoked", `select count(*) from api_keys where id = $1 and revoked_at is not null`, []any{keyID}},
		{"members added", `select count(*) from staff where name = $1`, []any{escalated}},
		{"the member revoked", `select count(*) from staff where id = $1 and revoked_at is not null`, []any{victim.id}},
		{"the admin's session ended", `select count(*) from console_sessions where id_hash = $1 and revoked_at is not null`, []any{admin.hash()}},
	} {
		var n int
		require.NoError(p, conn.QueryRow(ctx, q.sql, q.args...).Scan(&n), q.what)
		if n > 0 {
			changed = append(changed, fmt.Sprintf("%s: %d", q.what, n))
		}
	}
	if now := account(); now != was {
		changed = append(changed, "the account changed: "+now)
	}
	none(p, changed, "a viewer's refused console writes changed something")
	require.Equal(p, http.StatusOK, session.get(p, s.admit, "/console/accounts/"+org).status, "the viewer still reads")
}

// ended reports how the console at each admit node answers a session that should have
// ended, in cookie (csrf its form token): what is not a 303 to the sign-in page for a page,
// and not a 401 for a write (POST /console/accounts, an org named id-<node>).
func ended(p *P, s *stack, what, cookie, csrf, id string) []string {
	p.Helper()
	var bad []string
	for i, base := range []string{s.admit, s.slow} {
		a := visit(p, http.MethodGet, base+"/console/accounts", []string{sessionCookie + "=" + cookie}, nil)
		if loc := a.header.Get("Location"); a.status != http.StatusSeeOther || !strings.HasPrefix(loc, "/console/login") {
			bad = append(bad, fmt.Sprintf("%s, %s: GET %d (Location %q)", what, base, a.status, loc))
		}
		a = visit(p, http.MethodPost, base+"/console/accounts", []string{sessionCookie + "=" + cookie},
			url.Values{"csrf": {csrf}, "id": {fmt.Sprintf("%s-%d", id, i)}, "kind": {"org"}}, sameSite(base)...)
		if a.status != http.StatusUnauthorized {
			bad = append(bad, fmt.Sprintf("%s, %s: POST %d", what, base, a.status))
		}
	}
	return bad
}

// live requires that the session opens a page on each admit node.
func live(p *P, s *stack, what string, session consoleSession) {
	p.Helper()
	for _, base := range []string{s.admit, s.slow} {
		a := session.get(p, base, "/console/accounts")
		require.Equal(p, http.StatusOK, a.status, "%s before its end, at %s: %s", what, base, a.body)
	}
}

func consoleSessionEnd(p *P, s *stack) {
	ctx, conn := s.connect(p)
	var bad, ids []string
	check := func(what string, session consoleSession, csrf string) {
		id := s.id("console-ended-" + fmt.Sprint(len(ids)))
		ids = append(ids, id+"-0", id+"-1")
		bad = append(bad, ended(p, s, what, session.cookie, csrf, id)...)
	}

	// Signed out at the other node than the one signed in at.
	out := signInAt(p, s.admit, s.staff(p, "console signs out", "support").token)
	live(p, s, "signed out", out)
	a := out.post(p, s.slow, "/console/logout", nil)
	require.Equal(p, http.StatusSeeOther, a.status, "sign out: %s", a.String())
	require.Equal(p, "/console/login", a.header.Get("Location"))
	check("signed out", out, out.csrf)

	// Its member revoked through the admin API.
	m := s.staff(p, "console revoked", "support")
	revoked := signInAt(p, s.slow, m.token)
	live(p, s, "member revoked", revoked)
	a = do(p, http.MethodDelete, s.admit+"/v1/admin/staff/"+m.id, [][2]string{bearer(adminToken)}, nil)
	require.Equal(p, http.StatusOK, a.status, "revoke: %s", a.body)
	check("member revoked", revoked, revoked.csrf)

	// Ended by an admin on the sessions page.
	admin := signInAt(p, s.admit, adminToken)
	byAdmin := signInAt(p, s.admit, s.staff(p, "console ended", "finance").token)
	live(p, s, "ended by an admin", byAdmin)
	a = admin.post(p, s.admit, "/console/sessions/"+hex.EncodeToString(byAdmin.hash())+"/revoke", nil)
	require.Equal(p, http.StatusSeeOther, a.status, "end the session: %s", a.String())
	check("ended by an admin", byAdmin, byAdmin.csrf)

	// Past its end (CONSOLE_SESSION_TTL is hours: its end is moved back instead).
	expired := signInAt(p, s.admit, s.staff(p, "console expires", "viewer").token)
	live(p, s, "expired", expired)
	tag, err := conn.Exec(ctx, `update console_sessions set created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' where id_hash = $1`,
		expired.hash())
	require.NoError(p, err)
	require.EqualValues(p, 1, tag.RowsAffected(), "the session's row")
	check("expired", expired, expired.csrf)

	// Forged cookies: random, a live one with a character changed, the id the sessions page shows.
	genuine := signInAt(p, s.admit, adminToken)
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	tampered := []byte(genuine.cookie)
	tampered[10] ^= 1
	for what, cookie := range map[string]string{
		"a random cookie":                         base64.RawURLEncoding.EncodeToString(raw),
		"a live cookie with a character changed":  string(tampered),
		"the session's id from the sessions page": hex.EncodeToString(genuine.hash()),
	} {
		check(what, consoleSession{cookie: cookie}, genuine.csrf)
	}
	if made := accountsIn(p, ctx, conn, ids); len(made) > 0 {
		bad = append(bad, "accounts created by an ended session: "+strings.Join(made, ", "))
	}
	none(p, bad, "an ended or forged console session still answered")
	live(p, s, "the live session the forged cookies copy", genuine)
}

func consoleEscape(p *P, s *stack) {
	const markup, script = `<img src=x onerror=alert(1)>`, `<script>alert(2)</script>`
	org := s.id("console-escape")
	s.org(p, org, "pro", nil)
	raw, err := json.Marshal(map[string]any{"legal_name": markup, "address": []string{script},
		"city": "Berlin", "country": "DE"})
	require.NoError(p, err)
	a := do(p, http.MethodPut, s.admit+"/v1/admin/accounts/"+org+"/billing",
		[][2]string{bearer(adminToken), {"Content-Type", "application/json"}}, raw)
	require.Equal(p, http.StatusOK, a.status, "billing details: %s", a.body)
	admin := signInAt(p, s.admit, adminToken)

	// An account id is the one value the console puts in paths: it cannot carry markup.
	bold := "<b>" + s.run + "</b>"
	var bad []string
	rawMarkup := func(what string, a answer) {
		for _, m := range []string{markup, script, bold} {
			if strings.Contains(a.body, m) {
				bad = append(bad, fmt.Sprintf("%s: %s unescaped in the page", what, m))
			}
		}
	}
	search := admin.get(p, s.admit, "/console/accounts?"+url.Values{"q": {markup}}.Encode())
	require.Equal(p, http.StatusOK, search.status, search.body)
	require.Contains(p, search.body, `href="/console/accounts/`+org+`"`, "the search by the legal name finds the org")
	if !strings.Contains(search.body, `&lt;img src=x onerror=alert(1)&gt;`) {
		bad = append(bad, "the search: the legal name not shown escaped (&lt;img src=x onerror=alert(1)&gt;)")
	}
	rawMarkup("the search by the legal name", search)

	if a := post(p, s.admit+"/v1/admin/accounts", adminToken, map[string]any{"id": bold, "kind": "org", "plan": "pro"}); a.status != http.StatusBadRequest {
		bad = append(bad, fmt.Sprintf("the admin API took the account id %s: %d %s", bold, a.status, a.body))
	}
	a = admin.post(p, s.admit, "/console/accounts", url.Values{"id": {bold}, "kind": {"org"}, "plan": {"pro"}})
	if a.status != http.StatusBadRequest {
		bad = append(bad, fmt.Sprintf("the console took the account id %s: %d", bold, a.status))
	}
	rawMarkup("the console's refusal of "+bold, a)
	a = admin.get(p, s.admit, "/console/accounts/"+url.PathEscape(markup))
	if a.status != http.StatusNotFound {
		bad = append(bad, fmt.Sprintf("the page of the account %s: %d, want 404", markup, a.status))
	}
	rawMarkup("the page of the account "+markup, a)
	none(p, bad, "the console echoed markup")
}
