package api_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/period"
)

var allScopes = []string{"usage:read", "billing:read", "keys:write", "accounts:write"}

// portalTree is an org with two teams and a user in the first, each with quotas and rates:
//
//	org  (requests: 20/s burst 40, quota 1000)
//	├── team   (requests: quota 400)
//	│   └── user (requests: quota 100)
//	└── sibling
type portalTree struct{ org, team, user, sibling string }

func (b *testBundle) portalTree(t *testing.T, name string) portalTree {
	t.Helper()
	p := portalTree{org: b.id(name), team: b.id(name + "-team"), user: b.id(name + "-user"), sibling: b.id(name + "-sibling")}
	b.accounts(t,
		map[string]any{"id": p.org, "kind": "org", "plan": "pro", "limits": map[string]any{
			"requests": map[string]any{"rate_per_s": 20, "burst": 40, "quota": 1000}}},
		map[string]any{"id": p.team, "kind": "team", "parent": p.org, "limits": map[string]any{"requests": map[string]any{"quota": 400}}},
		map[string]any{"id": p.user, "kind": "user", "parent": p.team, "limits": map[string]any{"requests": map[string]any{"quota": 100}}},
		map[string]any{"id": p.sibling, "kind": "team", "parent": p.org})
	for _, id := range []string{p.org, p.team, p.user, p.sibling} {
		b.waitResolvable(t, id)
	}
	return p
}

func (b *testBundle) customerToken(t *testing.T, account string, scopes ...string) string {
	t.Helper()
	return b.issueCustomerToken(t, adminToken, map[string]any{"account": account, "scopes": scopes}).Token
}

// A team's token sees its team and below, with each level's limits and what is left of its
// quotas live, and nothing above or beside it: the org and the sibling answer exactly as
// an account that does not exist.
func TestPortalAccountView(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{customers: true})
	p := b.portalTree(t, "view")
	for range 3 {
		r := b.admit(t, map[string]any{"account": p.user})
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
	}
	tok := b.customerToken(t, p.team, "usage:read")

	var v struct {
		Account struct {
			ID, Kind, Parent string
		} `json:"account"`
		Levels []struct {
			Account string
			Quotas  map[string]struct {
				Used, Quota, Remaining int64
				Period                 string
				ResetsAt               time.Time `json:"resets_at"`
			}
		} `json:"levels"`
		Remaining map[string]int64 `json:"remaining"`
		Writable  bool             `json:"writable"`
	}
	r := b.call(t, "GET", "/v1/portal/accounts/"+p.user, tok, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &v))
	require.Equal(t, p.team, v.Account.Parent)
	require.Len(t, v.Levels, 2, "the token's team and the user; never the org")
	require.Equal(t, []string{p.team, p.user}, []string{v.Levels[0].Account, v.Levels[1].Account})
	q := v.Levels[1].Quotas["requests"]
	require.Equal(t, int64(3), q.Used)
	require.Equal(t, int64(97), q.Remaining)
	month := time.Now().UTC()
	require.Equal(t, time.Date(month.Year(), month.Month()+1, 1, 0, 0, 0, 0, time.UTC), q.ResetsAt.UTC())
	require.Equal(t, int64(397), v.Levels[0].Quotas["requests"].Remaining)
	require.Equal(t, int64(97), v.Remaining["requests"], "the least left of the levels shown")
	require.False(t, v.Writable, "usage:read writes nothing")
	require.NotContains(t, r.Raw, `"`+p.org+`"`, "nothing of the org")

	r = b.call(t, "GET", "/v1/portal/accounts/"+p.team, tok, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.NotContains(t, r.Raw, `"parent"`, "the token's own account hides its parent")

	missing := b.call(t, "GET", "/v1/portal/accounts/"+b.id("nowhere"), tok, nil)
	require.Equal(t, http.StatusNotFound, missing.Status, missing.Raw)
	for _, other := range []string{p.org, p.sibling} {
		r := b.call(t, "GET", "/v1/portal/accounts/"+other, tok, nil)
		requireSameAsMissing(t, missing, b.id("nowhere"), r, other)
	}

	kids := b.call(t, "GET", "/v1/portal/accounts/"+p.team+"/children", tok, nil)
	require.Equal(t, http.StatusOK, kids.Status, kids.Raw)
	require.Equal(t, []any{map[string]any{"id": p.user, "kind": "user", "parent": p.team}}, kids.Body["accounts"])
}

// requireSameAsMissing: got, the answer about the id other, is the answer about missingID,
// an id nothing has, with the id changed: nothing tells them apart.
func requireSameAsMissing(t *testing.T, missing reply, missingID string, got reply, other string) {
	t.Helper()
	require.Equal(t, missing.Status, got.Status, "%s: %s", other, got.Raw)
	require.Equal(t, strings.ReplaceAll(missing.Raw, missingID, other), got.Raw, other)
}

// accounts:write divides what the token's account has: children within every level above
// (the seller's too), never the token's own limits, never past them.
func TestPortalDividesWithinTheAccount(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{customers: true, staff: true})
	p := b.portalTree(t, "divide")
	tok := b.customerToken(t, p.team, "accounts:write", "usage:read")
	agent := b.id("divide-agent")

	for _, tt := range []struct {
		name   string
		limits map[string]any
		code   string
	}{
		{"a quota over the team's", map[string]any{"requests": map[string]any{"quota": 401}}, "limit_exceeds_parent"},
		{"a rate over the org's", map[string]any{"requests": map[string]any{"rate_per_s": 21, "burst": 10}}, "limit_exceeds_parent"},
		{"a burst over the org's", map[string]any{"requests": map[string]any{"rate_per_s": 1, "burst": 41}}, "limit_exceeds_parent"},
		{"a window over the org's rate", map[string]any{"requests": map[string]any{"algorithm": "sliding_window", "limit": 40, "window_s": 1}}, "limit_exceeds_parent"},
	} {
		r := b.call(t, "POST", "/v1/portal/accounts", tok, map[string]any{"id": agent, "kind": "agent", "parent": p.user, "limits": tt.limits})
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", tt.name, r.Raw)
		require.Equal(t, tt.code, errCode(r), tt.name)
	}
	r := b.call(t, "POST", "/v1/portal/accounts", tok, map[string]any{"id": agent, "kind": "agent", "parent": p.user,
		"limits": map[string]any{"requests": map[string]any{"quota": 50, "rate_per_s": 5, "burst": 10}}})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	require.Equal(t, true, r.Body["writable"])
	require.Len(t, r.Body["levels"], 3, "team, user, agent: the write's reply waited for the policies")

	r = b.call(t, "PUT", "/v1/portal/accounts/"+agent, tok, map[string]any{"limits": map[string]any{"requests": map[string]any{"quota": 101}}})
	require.Equal(t, http.StatusBadRequest, r.Status, "over the user's 100: %s", r.Raw)
	r = b.call(t, "PUT", "/v1/portal/accounts/"+agent, tok, map[string]any{"limits": map[string]any{"requests": map[string]any{"quota": 100}}})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	r = b.call(t, "PUT", "/v1/portal/accounts/"+p.team, tok, map[string]any{"limits": map[string]any{"requests": map[string]any{"quota": 1}}})
	require.Equal(t, http.StatusForbidden, r.Status, "its own limits are the seller's: %s", r.Raw)
	r = b.call(t, "PUT", "/v1/portal/accounts/"+agent, tok, map[string]any{"parent": p.sibling})
	require.Equal(t, http.StatusBadRequest, r.Status, "no moving: %s", r.Raw)

	// Outside the subtree: the sibling as a parent, the org's limits: 404, nothing written.
	r = b.call(t, "POST", "/v1/portal/accounts", tok, map[string]any{"id": b.id("divide-x"), "kind": "user", "parent": p.sibling})
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)
	r = b.call(t, "PUT", "/v1/portal/accounts/"+p.sibling, tok, map[string]any{"limits": map[string]any{}})
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM accounts WHERE id = $1`, b.id("divide-x")))

	// A path PostgreSQL cannot keep as it is (NUL) is refused and audited all the same.
	r = b.call(t, "PUT", "/v1/portal/accounts/x%00y", tok, map[string]any{"limits": map[string]any{}})
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM audit_log WHERE path = $1`, "/v1/portal/accounts/x\uFFFDy"))
	// The write is in the audit log, the token as its actor.
	var actor, role string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT actor, role FROM audit_log WHERE path = $1 AND status = 200`,
		"/v1/portal/accounts/"+agent).Scan(&actor, &role))
	require.True(t, strings.HasPrefix(actor, "ct_"), actor)
	require.Equal(t, "customer", role)
}

// keys:write creates and revokes the keys of the subtree, and no other: another org's key
// answers as a key that does not exist, and stays live.
func TestPortalKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{customers: true})
	p := b.portalTree(t, "keys")
	other := b.portalTree(t, "keys-other")
	theirs := b.call(t, "POST", "/v1/admin/api-keys", adminToken, map[string]any{"account": other.user})
	require.Equal(t, http.StatusCreated, theirs.Status, theirs.Raw)
	tok := b.customerToken(t, p.org, "keys:write")

	r := b.call(t, "POST", "/v1/portal/accounts/"+p.user+"/api-keys", tok, nil)
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	id, secret := r.Body["id"].(string), r.Body["api_key"].(string)
	require.True(t, strings.HasPrefix(secret, "mgk_"))
	list := b.call(t, "GET", "/v1/portal/accounts/"+p.user+"/api-keys", tok, nil)
	require.Equal(t, http.StatusOK, list.Status, list.Raw)
	require.Contains(t, list.Raw, id)
	require.NotContains(t, list.Raw, secret, "a list never shows a secret")

	missing := b.call(t, "DELETE", "/v1/portal/api-keys/key_0000000000000000", tok, nil)
	require.Equal(t, http.StatusNotFound, missing.Status, missing.Raw)
	theirID := theirs.Body["id"].(string)
	requireSameAsMissing(t, missing, "key_0000000000000000", b.call(t, "DELETE", "/v1/portal/api-keys/"+theirID, tok, nil), theirID)
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM api_keys WHERE id = $1 AND revoked_at IS NOT NULL`, theirID))

	r = b.call(t, "DELETE", "/v1/portal/api-keys/"+id, tok, nil)
	require.Equal(t, http.StatusNoContent, r.Status, r.Raw)
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM api_keys WHERE id = $1 AND revoked_at IS NOT NULL`, id))
}

// Every route of the customer API checks a scope: without a token it is 401, and every
// token of a scope it does not take is 403 missing_scope (GET /v1/portal/me takes any);
// no token without accounts:write or keys:write writes. A route added without its check
// fails here, for the walk is over api.Routes.
func TestPortalEveryRouteChecksItsScope(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{customers: true, invoices: true})
	p := b.portalTree(t, "scopes")
	tokens := map[string]string{}
	for _, s := range allScopes {
		tokens[s] = b.customerToken(t, p.org, s)
	}
	routes := 0
	for _, route := range api.Routes {
		method, pattern, _ := strings.Cut(route, " ")
		if !strings.HasPrefix(pattern, "/v1/portal/") {
			continue
		}
		routes++
		path := strings.ReplaceAll(pattern, "{id}", p.team)
		r := b.call(t, method, path, "", nil)
		require.Equal(t, http.StatusUnauthorized, r.Status, "%s without a token: %s", route, r.Raw)
		opened := 0
		for _, s := range allScopes {
			r := b.call(t, method, path, tokens[s], nil)
			if r.Status == http.StatusForbidden {
				require.Equal(t, "missing_scope", errCode(r), "%s as %s", route, s)
				continue
			}
			opened++
			if method != http.MethodGet {
				require.Contains(t, []string{"accounts:write", "keys:write"}, s, "%s writes as %s: %s", route, s, r.Raw)
			}
		}
		if pattern == "/v1/portal/me" {
			require.Equal(t, len(allScopes), opened, route)
			continue
		}
		require.Equal(t, 1, opened, "%s opens to exactly one scope", route)
	}
	require.GreaterOrEqual(t, routes, 14)
}

// The proof of isolation: org A's token with every scope, given every route of the customer
// API and every id of org B (accounts, keys, invoices, credit notes), gets 404 where the
// route takes an id, the same answer as for an id nothing has, and no list shows any of B.
func TestPortalIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{customers: true, invoices: true, staff: true})
	a, bee := b.portalTree(t, "iso-a"), b.portalTree(t, "iso-b")
	// Invoices and credit notes of an org B, with usage of its own.
	orgB := b.orgRow(t, b.id("iso-billed"))
	b.usageRow(t, orgB, 10, 10)
	invB := b.closeMonth(t)[orgB]
	v := b.call(t, "POST", fmt.Sprintf("/v1/admin/invoices/%d/void", invB.ID), adminToken, map[string]any{"reason": "test"})
	require.Equal(t, http.StatusOK, v.Status, v.Raw)
	noteB := int64(v.Body["credit_note"].(map[string]any)["id"].(float64))
	keyB := b.call(t, "POST", "/v1/admin/api-keys", adminToken, map[string]any{"account": bee.user}).Body["id"].(string)
	tok := b.customerToken(t, a.org, allScopes...)

	ids := map[string][]string{ // route parameter kind → B's ids of it, and one nothing has
		"account":     {bee.org, bee.team, bee.user, bee.sibling, orgB},
		"key":         {keyB},
		"invoice":     {fmt.Sprint(invB.ID), fmt.Sprintf("%d.pdf", invB.ID)},
		"credit note": {fmt.Sprint(noteB), fmt.Sprintf("%d.pdf", noteB)},
	}
	nothing := map[string]string{"account": b.id("iso-none"), "key": "key_0000000000000000", "invoice": "999999999", "credit note": "999999998"}
	kindOf := func(pattern string) string {
		switch {
		case strings.HasPrefix(pattern, "/v1/portal/api-keys/"):
			return "key"
		case strings.HasPrefix(pattern, "/v1/portal/invoices/"):
			return "invoice"
		case strings.HasPrefix(pattern, "/v1/portal/credit-notes/"):
			return "credit note"
		}
		return "account"
	}
	bodies := map[string]any{
		"POST /v1/portal/accounts/{id}/api-keys": nil,
		"PUT /v1/portal/accounts/{id}":           map[string]any{"limits": map[string]any{}},
	}
	checked := 0
	for _, route := range api.Routes {
		method, pattern, _ := strings.Cut(route, " ")
		if !strings.HasPrefix(pattern, "/v1/portal/") {
			continue
		}
		if !strings.Contains(pattern, "{id}") {
			continue // below: the lists and the create
		}
		kind := kindOf(pattern)
		missing := b.call(t, method, strings.ReplaceAll(pattern, "{id}", nothing[kind]), tok, bodies[route])
		require.Equal(t, http.StatusNotFound, missing.Status, "%s with an id nothing has: %s", route, missing.Raw)
		for _, id := range ids[kind] {
			if kind == "invoice" || kind == "credit note" {
				if strings.HasSuffix(id, ".pdf") {
					m := b.call(t, method, strings.ReplaceAll(pattern, "{id}", nothing[kind]+".pdf"), tok, nil)
					requireSameAsMissing(t, m, nothing[kind], b.call(t, method, strings.ReplaceAll(pattern, "{id}", id), tok, nil), strings.TrimSuffix(id, ".pdf"))
					checked++
					continue
				}
			}
			got := b.call(t, method, strings.ReplaceAll(pattern, "{id}", id), tok, bodies[route])
			requireSameAsMissing(t, missing, nothing[kind], got, id)
			checked++
		}
	}
	require.GreaterOrEqual(t, checked, 40)

	// The create: a parent of B's is 404, and nothing is made.
	r := b.call(t, "POST", "/v1/portal/accounts", tok, map[string]any{"id": b.id("iso-new"), "kind": "user", "parent": bee.team})
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM accounts WHERE id = $1`, b.id("iso-new")))
	// The lists: none of B's.
	for _, path := range []string{"/v1/portal/invoices", "/v1/portal/credit-notes", "/v1/portal/me",
		"/v1/portal/accounts/" + a.org + "/children", "/v1/portal/accounts/" + a.org + "/usage?by=child"} {
		r := b.call(t, "GET", path, tok, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", path, r.Raw)
		for _, id := range []string{bee.org, orgB, invB.Number} {
			require.NotContains(t, r.Raw, id, path)
		}
	}
	// A's audit rows hold nothing of B: a refused write reads no before of another's.
	me := b.call(t, "GET", "/v1/portal/me", tok, nil).Body["id"].(string)
	require.Positive(t, b.count(t, `SELECT count(*) FROM audit_log WHERE actor = $1`, me), "the writes are audited")
	require.Zero(t, b.count(t, `SELECT count(*) FROM audit_log WHERE actor = $1 AND before IS NOT NULL`, me))
	// B's own token sees its invoice: the 404s above were the subtree check, not a bug.
	mine := b.call(t, "GET", fmt.Sprintf("/v1/portal/invoices/%d", invB.ID), b.customerToken(t, orgB, "billing:read"), nil)
	require.Equal(t, http.StatusOK, mine.Status, mine.Raw)
	require.NotContains(t, mine.Raw, "issued_by")
}

// For random trees and token placements, a token sees and changes exactly its subtree, and
// every limit it sets is within every level above the account it sets it on.
func TestPortalSubtreeProperty(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{customers: true})
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)

	kinds := []string{"org", "team", "user", "agent"}
	for tree := range 3 {
		org := b.id(fmt.Sprintf("prop%d", tree))
		parent := map[string]string{org: ""}
		depth := map[string]int{org: 0}
		quota := map[string]int64{org: 1000}
		all := []string{org}
		b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro", "limits": map[string]any{"requests": map[string]any{"quota": 1000}}})
		for i := range 6 + rng.IntN(6) {
			var open []string // the accounts a child can go under: not agents
			for _, a := range all {
				if depth[a] < 3 {
					open = append(open, a)
				}
			}
			p := open[rng.IntN(len(open))]
			id := fmt.Sprintf("%s-%d", org, i)
			q := 1 + rng.Int64N(quota[p])
			b.account(t, map[string]any{"id": id, "kind": kinds[depth[p]+1], "parent": p, "limits": map[string]any{"requests": map[string]any{"quota": q}}})
			parent[id], depth[id], quota[id] = p, depth[p]+1, q
			all = append(all, id)
		}
		for _, id := range all {
			b.waitResolvable(t, id)
		}
		below := func(x, top string) bool {
			for ; x != ""; x = parent[x] {
				if x == top {
					return true
				}
			}
			return false
		}
		for range 3 {
			holder := all[rng.IntN(len(all))]
			tok := b.customerToken(t, holder, "usage:read", "accounts:write")
			for _, x := range all {
				r := b.call(t, "GET", "/v1/portal/accounts/"+x, tok, nil)
				if below(x, holder) {
					require.Equal(t, http.StatusOK, r.Status, "seed %d: %s sees %s: %s", seed, holder, x, r.Raw)
				} else {
					require.Equal(t, http.StatusNotFound, r.Status, "seed %d: %s must not see %s: %s", seed, holder, x, r.Raw)
				}
				if depth[x] == 3 || x == holder {
					continue
				}
				// A limit on a child of x, within or past the tightest quota above.
				tightest := quota[x]
				for y := x; y != ""; y = parent[y] {
					tightest = min(tightest, quota[y])
				}
				q := 1 + rng.Int64N(2*tightest)
				kid := fmt.Sprintf("%s-k%d", x, rng.Uint32())
				r = b.call(t, "POST", "/v1/portal/accounts", tok, map[string]any{"id": kid, "kind": kinds[depth[x]+1], "parent": x,
					"limits": map[string]any{"requests": map[string]any{"quota": q}}})
				switch {
				case !below(x, holder):
					require.Equal(t, http.StatusNotFound, r.Status, "seed %d: %s made %s below %s: %s", seed, holder, kid, x, r.Raw)
				case q > tightest:
					require.Equal(t, http.StatusBadRequest, r.Status, "seed %d: quota %d past %d: %s", seed, q, tightest, r.Raw)
				default:
					require.Equal(t, http.StatusCreated, r.Status, "seed %d: %s", seed, r.Raw)
				}
				made := b.count(t, `SELECT count(*) FROM accounts WHERE id = $1`, kid)
				require.Equal(t, map[bool]int64{true: 1, false: 0}[r.Status == http.StatusCreated], made, "seed %d", seed)
			}
		}
	}
}

// Usage comes from the billing log, exactly: per day and per month, for the account and
// for each child, and a team's token sees its own team's alone.
func TestPortalUsage(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{customers: true})
	p := b.portalTree(t, "usage")
	month := period.MonthStart(time.Now())
	day := month.Add(36 * time.Hour).Format(time.DateOnly) // usageEvent's event time
	b.usageEvent(t, month, 5, p.org)
	b.usageEvent(t, month, 7, p.org, p.team)
	b.usageEvent(t, month, 11, p.org, p.team, p.user)
	b.usageEvent(t, month, 13, p.org, p.sibling)
	void := b.usageEvent(t, month, 1000, p.org, p.team)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO usage_voids (event_id, attempt, reason, void_time, source, kafka_partition, kafka_offset)
		VALUES ($1, $1, 'caller_gone', now(), 'test', 0, 0)`, void)
	require.NoError(t, err)
	org := b.customerToken(t, p.org, "usage:read")

	type view struct {
		From, To, Granularity, By string
		Series                    []struct {
			Account string
			Points  []struct {
				Start    string
				Events   int64
				Requests int64
			}
		}
		Totals struct{ Events, Requests int64 }
	}
	get := func(token, path string) view {
		t.Helper()
		r := b.call(t, "GET", path, token, nil)
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
		var v view
		require.NoError(t, json.Unmarshal([]byte(r.Raw), &v))
		return v
	}
	v := get(org, "/v1/portal/accounts/"+p.org+"/usage")
	require.Equal(t, month.Format(time.DateOnly), v.From, "this month by default")
	require.Len(t, v.Series, 1)
	require.Equal(t, int64(36), v.Totals.Requests, "5+7+11+13; the voided 1000 bills nothing")
	require.Equal(t, int64(5), v.Totals.Events, "events counts every admission recorded, the voided one too")
	for _, pt := range v.Series[0].Points {
		if pt.Start == day {
			require.Equal(t, int64(36), pt.Requests)
		} else {
			require.Zero(t, pt.Requests, pt.Start)
		}
	}

	v = get(org, "/v1/portal/accounts/"+p.org+"/usage?by=child&granularity=month")
	byChild := map[string]int64{}
	for _, s := range v.Series {
		require.Len(t, s.Points, 12, "the last 12 months")
		byChild[s.Account] = s.Points[11].Requests
	}
	require.Equal(t, map[string]int64{p.team: 18, p.sibling: 13}, byChild)
	require.Equal(t, int64(36), v.Totals.Requests, "the org's own total, its own traffic included")

	team := b.customerToken(t, p.team, "usage:read")
	v = get(team, "/v1/portal/accounts/"+p.team+"/usage?by=child")
	require.Len(t, v.Series, 1)
	require.Equal(t, p.user, v.Series[0].Account)
	require.Equal(t, int64(18), v.Totals.Requests)
	r := b.call(t, "GET", "/v1/portal/accounts/"+p.org+"/usage", team, nil)
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)

	for _, q := range []string{"from=2026-13-01", "from=2026-02-01&to=2026-01-01", "from=2020-01-01&to=2026-01-01",
		"granularity=week", "by=key", "granularity=month&from=2000-01-01&to=2026-01-01"} {
		r := b.call(t, "GET", "/v1/portal/accounts/"+p.org+"/usage?"+q, org, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", q, r.Raw)
	}
}
