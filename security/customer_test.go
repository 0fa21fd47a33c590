package security_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/invoice"
)

// Finding 16: the customer API. A customer token reaches its own subtree and nothing
// else: another org's ids answer as ids that do not exist; it is refused on every node
// within a second of its revocation or its end; it opens neither the service API nor the
// admin API, whose tokens do not open it; it divides its account's limits, never exceeds
// them; and its usage queries are bounded.
func customerProbes() []probe {
	return []probe{
		{name: "F16-customer-cross-org", desc: "org A's token with every scope on every /v1/portal route (walked from api.Routes) with org B's ids (accounts, an API key, an invoice and a credit note with their .pdf/.html/.csv): each 404 and the same answer as for an id nothing has; A's lists and /me name nothing of B; B's accounts and key unchanged, nothing created under B",
			run: customerCrossOrg},
		{name: "F16-customer-revoked", desc: "a customer token revoked through DELETE /v1/admin/customer-tokens/{id}, and one of ttl_s 1 past its end: 401 on a read and a write on both admit nodes within 1 s; no key written",
			run: customerRevoked},
		{name: "F16-customer-not-other-apis", desc: "a customer token on the service API (POST /v1/admit, /v1/estimate, /v1/outcomes, GET /v1/usage, /v1/balance, /v1/check, gRPC ShouldRateLimit) and the admin API (GET and POST of accounts, API keys, customer tokens): 401/403 each, nothing written; the admin and service tokens on /v1/portal/me: 403",
			run: customerNotOtherAPIs},
		{name: "F16-customer-exceed", desc: "a team's accounts:write token: a child or a child's limits above the team's (quota, rate, burst, sliding window, ceiling, concurrency, concurrency 0) 400 limit_exceeds_parent; its own team 403; plan/priority/shadow 400 unknown_field; 2^53+1, 1e300, negatives, 60 KB strings, NUL in ids 400 (404 for an id in the path), never 5xx; nothing written",
			run: customerExceed},
		{name: "F16-customer-usage-bounds", desc: "usage and children queries with absurd ranges, bad dates, granularity and by values, limit 0/-1/10^9, NUL and 10 KB values: 400 each within 1 s; the largest ranges allowed (366 days, 60 months by child) 200 within 2 s",
			run: customerUsageBounds},
	}
}

// allScopes are every scope of a customer token (customer.Scopes).
var allScopes = []string{"usage:read", "billing:read", "keys:write", "accounts:write"}

// customerToken is a customer token issued through the admin API: its id, secret and end.
type customerToken struct {
	id, secret string
	expires    time.Time
}

// customerToken issues a token of account with scopes through POST /v1/admin/customer-tokens;
// ttl 0 leaves ttl_s out (the default lifetime).
func (s *stack) customerToken(p *P, account string, ttl int, scopes ...string) customerToken {
	p.Helper()
	body := map[string]any{"account": account, "scopes": scopes, "name": "security " + s.run}
	if ttl > 0 {
		body["ttl_s"] = ttl
	}
	a := post(p, s.admit+"/v1/admin/customer-tokens", adminToken, body)
	require.Equal(p, http.StatusCreated, a.status, "issue a customer token of %s: %s", account, a.body)
	id, _ := a.json["id"].(string)
	secret, _ := a.json["token"].(string)
	end, _ := a.json["expires_at"].(string)
	require.True(p, strings.HasPrefix(secret, "mgc_"), a.body)
	expires, err := time.Parse(time.RFC3339Nano, end)
	require.NoError(p, err, a.body)
	return customerToken{id: id, secret: secret, expires: expires}
}

// send is a request with the token's Authorization header and a JSON body ("": none).
func (c customerToken) send(p *P, method, url, body string) answer {
	p.Helper()
	var raw []byte
	if body != "" {
		raw = []byte(body)
	}
	return do(p, method, url, [][2]string{bearer(c.secret), {"Content-Type", "application/json"}}, raw)
}

// documentsOf gives org an invoice and a credit note, and returns their ids: one usage
// event in March 2025, closed by invoice.Close on the stack's database (no other probe's
// org existed then or used that month, so the close invoices org alone), then the invoice
// voided through the admin API.
func (s *stack) documentsOf(p *P, org string) (inv, note string) {
	p.Helper()
	ctx, conn := s.connect(p)
	mar := time.Date(2025, time.March, 1, 0, 0, 0, 0, time.UTC)
	_, err := conn.Exec(ctx, `select usage_events_partition($1)`, mar)
	require.NoError(p, err)
	_, err = conn.Exec(ctx, `
		insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind,
		                          path, source, requests, tokens, late, kafka_partition, kafka_offset)
		values ($1, $2, $3, $2, $4, $4, 'org', array[$4::text], 'security', 1000, 0, false, 0, 0)`,
		"f16-"+s.run, mar, mar.Add(time.Hour), org)
	require.NoError(p, err, "the usage event of %s", org)
	pool, err := pgxpool.New(ctx, s.databaseURL())
	require.NoError(p, err)
	defer pool.Close()
	res, err := invoice.Close(ctx, pool, mar, invoice.Options{Force: true, By: "security suite"})
	require.NoError(p, err, "close March 2025")
	for _, i := range res.Invoices {
		if i.Org == org {
			inv = fmt.Sprint(i.ID)
		}
	}
	require.NotEmpty(p, inv, "the close issued no invoice to %s: %+v", org, res)
	a := post(p, s.admit+"/v1/admin/invoices/"+inv+"/void", adminToken, map[string]any{"reason": "security suite"})
	require.Equal(p, http.StatusOK, a.status, "void invoice %s: %s", inv, a.body)
	cn, _ := a.json["credit_note"].(map[string]any)
	id, _ := cn["id"].(float64)
	require.NotZero(p, id, "the void's credit note: %s", a.body)
	return inv, fmt.Sprint(int64(id))
}

// sameAnswer is how a, the answer for id, differs from ghost, the answer for ghostID, an
// id nothing has, once ghostID is read as id; "" when they are the same but for Date and
// Content-Length (the ids' lengths may differ).
func sameAnswer(a, ghost answer, id, ghostID string) string {
	strip := func(x answer, from, to string) answer {
		h := x.header.Clone()
		h.Del("Date")
		h.Del("Content-Length")
		return answer{status: x.status, header: h, body: strings.ReplaceAll(x.body, from, to)}
	}
	if got, want := strip(a, id, id).String(), strip(ghost, ghostID, id).String(); got != want {
		return fmt.Sprintf("%q, where an id nothing has answers %q", got, want)
	}
	return ""
}

// portalRoutes are the routes of api.Routes under /v1/portal/ ("GET /v1/portal/me").
func portalRoutes() []string {
	var routes []string
	for _, r := range api.Routes {
		if _, path, _ := strings.Cut(r, " "); strings.HasPrefix(path, "/v1/portal/") {
			routes = append(routes, r)
		}
	}
	return routes
}

func customerCrossOrg(p *P, s *stack) {
	orgA, orgB := s.id("f16-cross-a"), s.id("f16-cross-b")
	team, user := s.id("f16-cross-b-team"), s.id("f16-cross-b-user")
	s.org(p, orgA, "pro", nil)
	s.org(p, orgB, "pro", map[string]any{"requests": map[string]any{"quota": 1000}})
	s.account(p, map[string]any{"id": team, "kind": "team", "parent": orgB, "limits": map[string]any{"requests": map[string]any{"quota": 100}}})
	s.account(p, map[string]any{"id": user, "kind": "user", "parent": team})
	k := post(p, s.admit+"/v1/admin/api-keys", adminToken, map[string]any{"account": user})
	require.Equal(p, http.StatusCreated, k.status, k.body)
	key, _ := k.json["id"].(string)
	require.NotEmpty(p, key, k.body)
	inv, note := s.documentsOf(p, orgB)
	tokA, tokB := s.customerToken(p, orgA, 0, allScopes...), s.customerToken(p, orgB, 0, allScopes...)

	// B's own token opens each of B's ids at this node: the 404s below are A's, not those
	// of a node that has not learned B's accounts yet.
	for _, path := range []string{"/accounts/" + user, "/accounts/" + team + "/children", "/invoices/" + inv, "/credit-notes/" + note + ".pdf"} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			a := tokB.send(p, http.MethodGet, s.admit+"/v1/portal"+path, "")
			if a.status == http.StatusOK {
				break
			}
			require.True(p, time.Now().Before(deadline), "B's own token on %s: %s", path, a.String())
			time.Sleep(10 * time.Millisecond)
		}
	}

	ctx, conn := s.connect(p)
	snapshot := func() string {
		var accounts, keys string
		require.NoError(p, conn.QueryRow(ctx, `select coalesce(json_agg(a order by a.id), '[]')::text from accounts a where org = $1`, orgB).Scan(&accounts))
		require.NoError(p, conn.QueryRow(ctx, `select coalesce(json_agg(k order by k.id), '[]')::text from api_keys k
			where account in (select id from accounts where org = $1)`, orgB).Scan(&keys))
		return accounts + "\n" + keys
	}
	was := snapshot()

	// Each case is a request of one route for one of B's ids (path and body written with
	// id), sent again with ghost, an id nothing has.
	type cross struct {
		method, path, body string
		id, ghost          string
	}
	ghostAccount, ghostKey := s.id("f16-cross-nobody"), "key_0123456789abcdef"
	ghostDocument := "9" + strings.Repeat("0", 12) + inv // no invoice or credit note has such an id
	child := s.id("f16-cross-b-new")
	account := func(method, suffix, body string, ids ...string) []cross {
		var cs []cross
		for _, id := range ids {
			cs = append(cs, cross{method, "/v1/portal/accounts/{id}" + suffix, body, id, ghostAccount})
		}
		return cs
	}
	document := func(kind, id, ghost string) []cross {
		var cs []cross
		for _, ext := range []string{"", ".pdf", ".html", ".csv"} {
			cs = append(cs, cross{http.MethodGet, "/v1/portal/" + kind + "/{id}" + ext, "", id, ghost})
		}
		return cs
	}
	limits := `{"limits":{"requests":{"quota":1}}}`
	cases := map[string][]cross{
		"GET /v1/portal/accounts/{id}":           account(http.MethodGet, "", "", orgB, team, user),
		"GET /v1/portal/accounts/{id}/children":  account(http.MethodGet, "/children", "", orgB, team),
		"GET /v1/portal/accounts/{id}/usage":     append(account(http.MethodGet, "/usage", "", orgB, user), account(http.MethodGet, "/usage?by=child", "", orgB)...),
		"PUT /v1/portal/accounts/{id}":           account(http.MethodPut, "", limits, orgB, team, user),
		"GET /v1/portal/accounts/{id}/api-keys":  account(http.MethodGet, "/api-keys", "", orgB, user),
		"POST /v1/portal/accounts/{id}/api-keys": account(http.MethodPost, "/api-keys", "", orgB, user),
		"GET /v1/portal/accounts/{id}/balance":   account(http.MethodGet, "/balance", "", orgB, user),
		"POST /v1/portal/accounts": {
			{http.MethodPost, "/v1/portal/accounts", `{"id":"` + child + `","kind":"team","parent":"{id}"}`, orgB, ghostAccount},
			{http.MethodPost, "/v1/portal/accounts", `{"id":"` + child + `","kind":"user","parent":"{id}"}`, team, ghostAccount},
		},
		"DELETE /v1/portal/api-keys/{id}":  {{http.MethodDelete, "/v1/portal/api-keys/{id}", "", key, ghostKey}},
		"GET /v1/portal/invoices/{id}":     document("invoices", inv, ghostDocument),
		"GET /v1/portal/credit-notes/{id}": document("credit-notes", note, ghostDocument),
	}
	// The routes without an id: what they show must name nothing of B.
	lists := map[string]string{"GET /v1/portal/me": "/v1/portal/me", "GET /v1/portal/invoices": "/v1/portal/invoices",
		"GET /v1/portal/credit-notes": "/v1/portal/credit-notes"}

	var missing, bad []string
	for _, route := range portalRoutes() {
		if cases[route] == nil && lists[route] == "" {
			missing = append(missing, route)
		}
	}
	none(p, missing, "routes of the customer API this probe does not send B's ids to")

	for route, cs := range cases {
		for _, c := range cs {
			with := func(id string) answer {
				r := strings.NewReplacer("{id}", id)
				return tokA.send(p, c.method, s.admit+r.Replace(c.path), r.Replace(c.body))
			}
			a, ghost := with(c.id), with(c.ghost)
			what := fmt.Sprintf("%s (%s %s)", route, c.method, strings.ReplaceAll(c.path, "{id}", c.id))
			if a.status != http.StatusNotFound {
				bad = append(bad, fmt.Sprintf("%s: %d, want 404: %s", what, a.status, a.body))
			} else if diff := sameAnswer(a, ghost, c.id, c.ghost); diff != "" {
				bad = append(bad, what+": "+diff)
			}
		}
	}
	for route, path := range lists {
		a := tokA.send(p, http.MethodGet, s.admit+path, "")
		if a.status != http.StatusOK {
			bad = append(bad, fmt.Sprintf("%s: %d, want 200: %s", route, a.status, a.body))
		}
		for _, id := range []string{orgB, team, user, key, `"id":` + inv, `"id":` + note} {
			if strings.Contains(a.body, id) {
				bad = append(bad, fmt.Sprintf("%s names %s of B: %s", route, id, a.body))
			}
		}
	}
	none(p, bad, "org A's token reached org B")
	require.Equal(p, was, snapshot(), "B's accounts and keys unchanged, nothing created under B")
	var live bool
	require.NoError(p, conn.QueryRow(ctx, `select revoked_at is null from api_keys where id = $1`, key).Scan(&live))
	require.True(p, live, "B's key is live")
}

// refusedAt reports how each admit node answers tok until deadline: each must answer
// GET /v1/portal/me 401 by then, and once it does, a read and a write 401 too.
func refusedAt(p *P, s *stack, what string, tok customerToken, account string, deadline time.Time) []string {
	p.Helper()
	var bad []string
	for _, base := range []string{s.admit, s.slow} {
		for {
			a := tok.send(p, http.MethodGet, base+"/v1/portal/me", "")
			if a.status == http.StatusUnauthorized && a.code() == "unauthorized" {
				break
			}
			if time.Now().After(deadline) {
				bad = append(bad, fmt.Sprintf("%s, %s: GET /v1/portal/me still %d after the deadline: %s", what, base, a.status, a.body))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		for _, w := range [][2]string{{http.MethodGet, "/v1/portal/accounts/" + account}, {http.MethodPost, "/v1/portal/accounts/" + account + "/api-keys"}} {
			if a := tok.send(p, w[0], base+w[1], ""); a.status != http.StatusUnauthorized {
				bad = append(bad, fmt.Sprintf("%s, %s: %s %s %d, want 401", what, base, w[0], w[1], a.status))
			}
		}
	}
	return bad
}

// opens requires that tok opens GET /v1/portal/me on each admit node.
func opens(p *P, s *stack, what string, tok customerToken) {
	p.Helper()
	for _, base := range []string{s.admit, s.slow} {
		a := tok.send(p, http.MethodGet, base+"/v1/portal/me", "")
		require.Equal(p, http.StatusOK, a.status, "%s, before its end, at %s: %s", what, base, a.body)
	}
}

func customerRevoked(p *P, s *stack) {
	org := s.id("f16-revoked")
	s.org(p, org, "pro", nil)

	revoked := s.customerToken(p, org, 0, "usage:read", "keys:write")
	opens(p, s, "the token to revoke", revoked)
	a := do(p, http.MethodDelete, s.admit+"/v1/admin/customer-tokens/"+revoked.id, [][2]string{bearer(adminToken)}, nil)
	require.Equal(p, http.StatusOK, a.status, "revoke: %s", a.body)
	require.NotEmpty(p, a.json["revoked_at"], a.body)
	bad := refusedAt(p, s, "revoked", revoked, org, time.Now().Add(time.Second))

	// ttl_s 1: checked before its end when the machine is quick enough to, refused 1 s after.
	expiring := s.customerToken(p, org, 1, "usage:read", "keys:write")
	if time.Until(expiring.expires) > 300*time.Millisecond {
		opens(p, s, "the token of ttl_s 1", expiring)
	}
	bad = append(bad, refusedAt(p, s, "expired", expiring, org, expiring.expires.Add(time.Second))...)
	none(p, bad, "a revoked or expired customer token still answered")

	ctx, conn := s.connect(p)
	var keys int
	require.NoError(p, conn.QueryRow(ctx, `select count(*) from api_keys where account = $1`, org).Scan(&keys))
	require.Zero(p, keys, "no API key written by an ended token")
}

func customerNotOtherAPIs(p *P, s *stack) {
	org := s.id("f16-apis")
	s.org(p, org, "pro", nil)
	tok := s.customerToken(p, org, 0, allScopes...)
	require.Equal(p, http.StatusOK, tok.send(p, http.MethodGet, s.admit+"/v1/portal/me", "").status, "the token opens its own API")

	refused := func(status int) bool { return status == http.StatusUnauthorized || status == http.StatusForbidden }
	var let []string
	for _, w := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/admit", `{"account":"` + org + `","units":{"requests":1}}`},
		{http.MethodPost, "/v1/estimate", `{"account":"` + org + `","model":"gpt-4o","body":{"messages":[]}}`},
		{http.MethodPost, "/v1/outcomes", `{"event_id":"x","status":200}`},
		{http.MethodGet, "/v1/usage/" + org, ""},
		{http.MethodGet, "/v1/balance/" + org, ""},
		{http.MethodGet, "/v1/admin/accounts/" + org, ""},
		{http.MethodPost, "/v1/admin/api-keys", `{"account":"` + org + `"}`},
		{http.MethodGet, "/v1/admin/customer-tokens?org=" + org, ""},
		{http.MethodPost, "/v1/admin/customer-tokens", `{"account":"` + org + `","scopes":["usage:read"]}`},
	} {
		if a := tok.send(p, w.method, s.admit+w.path, w.body); !refused(a.status) {
			let = append(let, w.method+" "+w.path+": "+a.String())
		}
	}
	for _, h := range [][2]string{{"X-Metergate-Token", tok.secret}, bearer(tok.secret)} {
		a := do(p, http.MethodGet, s.admit+"/v1/check", [][2]string{h, {"X-Metergate-Account", org}}, nil)
		if !refused(a.status) {
			let = append(let, "GET /v1/check with "+h[0]+": "+a.String())
		}
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(p.Context(), "authorization", "Bearer "+tok.secret), 10*time.Second)
	defer cancel()
	_, err := s.rls(p).c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "metergate", Descriptors: nil})
	if c := status.Code(err); c != codes.Unauthenticated && c != codes.PermissionDenied {
		let = append(let, "gRPC ShouldRateLimit: "+c.String())
	}
	none(p, let, "a customer token opened the service or admin API")

	// The other tokens on the customer API: the admin's and the service's are 403 (they
	// open the other APIs), a staff member's refused too.
	for name, token := range map[string]string{"the admin token": adminToken, "the service token": serviceToken} {
		a := do(p, http.MethodGet, s.admit+"/v1/portal/me", [][2]string{bearer(token)}, nil)
		if a.status != http.StatusForbidden {
			let = append(let, fmt.Sprintf("%s on /v1/portal/me: %d, want 403", name, a.status))
		}
	}
	staff := s.staff(p, "f16 admin", "admin")
	if a := staff.send(p, http.MethodGet, s.admit+"/v1/portal/me", ""); !refused(a.status) {
		let = append(let, fmt.Sprintf("an admin member's staff token on /v1/portal/me: %d", a.status))
	}
	none(p, let, "another API's token opened the customer API")

	dbctx, conn := s.connect(p)
	var keys, tokens int
	require.NoError(p, conn.QueryRow(dbctx, `select count(*) from api_keys where account = $1`, org).Scan(&keys))
	require.NoError(p, conn.QueryRow(dbctx, `select count(*) from customer_tokens where account = $1`, org).Scan(&tokens))
	require.Zero(p, keys, "no API key written")
	require.Equal(p, 1, tokens, "no customer token issued but the probe's")
}

func customerExceed(p *P, s *stack) {
	org, team, user := s.id("f16-exceed"), s.id("f16-exceed-team"), s.id("f16-exceed-user")
	s.org(p, org, "pro", map[string]any{"requests": map[string]any{"quota": 1000, "rate_per_s": 100, "burst": 200}})
	s.account(p, map[string]any{"id": team, "kind": "team", "parent": org, "concurrency": 5,
		"limits": map[string]any{"requests": map[string]any{"quota": 100, "rate_per_s": 10, "burst": 20}}})
	s.account(p, map[string]any{"id": user, "kind": "user", "parent": team, "concurrency": 1,
		"limits": map[string]any{"requests": map[string]any{"quota": 10, "rate_per_s": 1, "burst": 2}}})
	tok := s.customerToken(p, team, 0, "usage:read", "accounts:write")

	// Within the team's limits a child is made: the refusals below are the bound's.
	ok := s.id("f16-exceed-ok")
	a := tok.send(p, http.MethodPost, s.admit+"/v1/portal/accounts", `{"id":"`+ok+`","kind":"user","parent":"`+team+`","concurrency":5,`+
		`"limits":{"requests":{"quota":100,"rate_per_s":10,"burst":20}}}`)
	require.Equal(p, http.StatusCreated, a.status, "a child at the team's limits: %s", a.body)

	ctx, conn := s.connect(p)
	snapshot := func() string {
		var rows string
		require.NoError(p, conn.QueryRow(ctx, `select coalesce(json_agg(a order by a.id), '[]')::text from accounts a where org = $1`, org).Scan(&rows))
		return rows
	}
	was := snapshot()

	// Each body is tried as a new child of the team (POST) and as the user's (PUT), with
	// the code it must be refused with ("" any 400).
	type attempt struct{ what, code, fields string }
	huge := strings.Repeat("x", 60<<10)
	over := []attempt{
		{"a quota above the team's", "limit_exceeds_parent", `"limits":{"requests":{"quota":101}}`},
		{"a rate above the team's", "limit_exceeds_parent", `"limits":{"requests":{"rate_per_s":11,"burst":20}}`},
		{"a burst above the team's", "limit_exceeds_parent", `"limits":{"requests":{"rate_per_s":10,"burst":21}}`},
		{"a sliding window faster than the team's rate", "limit_exceeds_parent", `"limits":{"requests":{"algorithm":"sliding_window","limit":20,"window_s":1}}`},
		{"a ceiling above the team's burst", "limit_exceeds_parent", `"limits":{"requests":{"rate_per_s":10,"burst":20,"ceiling":1000}}`},
		{"a concurrency above the team's", "limit_exceeds_parent", `"concurrency":6`},
		{"concurrency 0 (no cap) under a team's cap", "limit_exceeds_parent", `"concurrency":0`},
		{"a quota of 2^53+1", "limit_exceeds_parent", `"limits":{"requests":{"quota":9007199254740993}}`},
		{"a rate of 1e300", "limit_exceeds_parent", `"limits":{"requests":{"rate_per_s":1e300,"burst":1}}`},
		{"a concurrency of 2^53+1", "limit_exceeds_parent", `"concurrency":9007199254740993`},
		{"a quota of 1e300", "", `"limits":{"requests":{"quota":1e300}}`},
		{"a concurrency of 1e300", "", `"concurrency":1e300`},
		{"a quota of -5", "", `"limits":{"requests":{"quota":-5}}`},
		{"a rate of -1", "", `"limits":{"requests":{"rate_per_s":-1,"burst":1}}`},
		{"a burst of -1", "", `"limits":{"requests":{"rate_per_s":1,"burst":-1}}`},
		{"a concurrency of -1", "", `"concurrency":-1`},
		{"a quota as a string", "", `"limits":{"requests":{"quota":"5"}}`},
		{"a unit of 60 KB", "", `"limits":{"` + huge + `":{"quota":1}}`},
		{"a quota period of 60 KB", "", `"limits":{"requests":{"quota":1,"quota_period":"` + huge + `"}}`},
		{"a plan", "unknown_field", `"plan":"enterprise"`},
		{"a priority", "unknown_field", `"priority":100`},
		{"shadow mode", "unknown_field", `"shadow":true`},
	}
	var bad []string
	refusal := func(what, code string, want []int, a answer) {
		switch {
		case a.status >= 500:
			bad = append(bad, fmt.Sprintf("%s: %d (a server error): %.300s", what, a.status, a.body))
		case !slices.Contains(want, a.status):
			bad = append(bad, fmt.Sprintf("%s: %d, want %v: %.300s", what, a.status, want, a.body))
		case code != "" && a.code() != code:
			bad = append(bad, fmt.Sprintf("%s: code %q, want %s: %.300s", what, a.code(), code, a.body))
		}
	}
	var tried []string
	for i, at := range over {
		child := s.id(fmt.Sprintf("f16-exceed-%d", i))
		tried = append(tried, child)
		a := tok.send(p, http.MethodPost, s.admit+"/v1/portal/accounts", `{"id":"`+child+`","kind":"user","parent":"`+team+`",`+at.fields+`}`)
		refusal("a child with "+at.what, at.code, []int{http.StatusBadRequest}, a)
		a = tok.send(p, http.MethodPut, s.admit+"/v1/portal/accounts/"+user, `{`+at.fields+`}`)
		refusal("the user set to "+at.what, at.code, []int{http.StatusBadRequest}, a)
	}

	// Below the user, its own limits bind (a grandchild of the token's team).
	grandchild := s.id("f16-exceed-grandchild")
	tried = append(tried, grandchild)
	a = tok.send(p, http.MethodPost, s.admit+"/v1/portal/accounts", `{"id":"`+grandchild+`","kind":"agent","parent":"`+user+`","limits":{"requests":{"quota":11}}}`)
	refusal("a child of the user above the user's quota", "limit_exceeds_parent", []int{http.StatusBadRequest}, a)

	// Its own team is the seller's to set, even within the team's limits.
	for _, body := range []string{`{"limits":{"requests":{"quota":50}}}`, `{"limits":{"requests":{"quota":100000}},"concurrency":0}`} {
		refusal("the team's own limits "+body, "forbidden", []int{http.StatusForbidden},
			tok.send(p, http.MethodPut, s.admit+"/v1/portal/accounts/"+team, body))
	}

	// Hostile ids: in a body 400; in the path or as the parent, an id of no account: 404.
	nul := s.id("f16-exceed-nul") + "\u0000x"
	tried = append(tried, s.id("f16-exceed-nul")) // PostgreSQL's text holds no NUL: the id cut there
	for _, c := range []struct {
		what, method, path, body string
		want                     []int
	}{
		{"an id with NUL", http.MethodPost, "/v1/portal/accounts", `{"id":"` + strings.ReplaceAll(nul, "\u0000", `\u0000`) + `","kind":"user","parent":"` + team + `"}`, []int{400}},
		{"an id of 60 KB", http.MethodPost, "/v1/portal/accounts", `{"id":"` + huge + `","kind":"user","parent":"` + team + `"}`, []int{400}},
		{"a kind of 60 KB", http.MethodPost, "/v1/portal/accounts", `{"id":"` + s.id("f16-exceed-kind") + `","kind":"` + huge + `","parent":"` + team + `"}`, []int{400}},
		{"a body of 100 KB", http.MethodPost, "/v1/portal/accounts", `{"id":"` + strings.Repeat("y", 100<<10) + `","kind":"user","parent":"` + team + `"}`, []int{400}},
		{"a parent with NUL", http.MethodPost, "/v1/portal/accounts", `{"id":"` + s.id("f16-exceed-p") + `","kind":"user","parent":"` + team + `\u0000"}`, []int{400, 404}},
		{"a path id with NUL", http.MethodPut, "/v1/portal/accounts/" + url.PathEscape(user+"\x00"), `{"limits":{"requests":{"quota":1}}}`, []int{400, 404}},
		{"a path id of 10 KB", http.MethodPut, "/v1/portal/accounts/" + huge[:10<<10], `{"limits":{"requests":{"quota":1}}}`, []int{400, 404}},
	} {
		refusal(c.what, "", c.want, tok.send(p, c.method, s.admit+c.path, c.body))
	}
	none(p, bad, "a team's token exceeded its team, or a hostile value was not a 4xx")

	require.Equal(p, was, snapshot(), "nothing written to the org's accounts")
	require.Empty(p, accountsIn(p, ctx, conn, tried), "no account created by a refused write")
}

func customerUsageBounds(p *P, s *stack) {
	org, team := s.id("f16-usage"), s.id("f16-usage-team")
	s.org(p, org, "pro", nil)
	s.account(p, map[string]any{"id": team, "kind": "team", "parent": org})
	tok := s.customerToken(p, org, 0, "usage:read")
	huge := strings.Repeat("9", 10<<10)
	base := s.admit + "/v1/portal/accounts/" + org

	var bad []string
	timed := func(path string, want int, within time.Duration) {
		start := time.Now()
		a := tok.send(p, http.MethodGet, base+path, "")
		took := time.Since(start)
		if a.status != want {
			bad = append(bad, fmt.Sprintf("%.200s: %d, want %d: %.200s", path, a.status, want, a.body))
		}
		if took > within {
			bad = append(bad, fmt.Sprintf("%.200s: answered in %s, want %s at most", path, took.Round(time.Millisecond), within))
		}
	}
	for _, q := range []string{
		"from=0001-01-01&to=9999-12-31",
		"granularity=month&from=0001-01-01&to=9999-12-01",
		"from=2025-01-01&to=2026-01-03",                   // 367 days
		"granularity=month&from=2020-01-01&to=2025-02-01", // 61 months
		"by=child&from=0001-01-01&to=9999-12-31",
		"from=2026-13-01", "from=2026-02-30", "from=2026-1-1", "from=20260101", "from=-0001-01-01",
		"to=2026-01-01T00:00:00Z", "from=%00", "from=" + huge, "to=" + huge,
		"from=2026-02-01&to=2026-01-01", "from=2026-02-01&to=2026-02-01",
		"granularity=hour", "granularity=DAY", "granularity=%00", "granularity=" + huge,
		"by=org", "by=child%00", "by=" + huge,
		"by=child&limit=0", "by=child&limit=-1", "by=child&limit=1000000000", "by=child&limit=1e3",
		"by=child&limit=99999999999999999999", "by=child&limit=" + huge, "by=child&after=%00", "by=child&after=" + huge,
	} {
		timed("/usage?"+q, http.StatusBadRequest, time.Second)
	}
	for _, q := range []string{"limit=0", "limit=-1", "limit=1000000000", "limit=" + huge, "after=%00", "after=" + huge} {
		timed("/children?"+q, http.StatusBadRequest, time.Second)
	}
	// The largest queries allowed are answered, and quickly: the bounds are what stop the rest.
	for _, q := range []string{"from=2025-01-01&to=2026-01-02", "granularity=month&from=2020-01-01&to=2025-01-01&by=child&limit=199"} {
		timed("/usage?"+q, http.StatusOK, 2*time.Second)
	}
	none(p, bad, "an unbounded or malformed usage query was answered")
}
