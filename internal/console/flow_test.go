package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/staff"
)

// admit asks admit for a decision as a calling service does.
func (b *testBundle) admit(t *testing.T, body map[string]any) (int, map[string]any) {
	t.Helper()
	status, raw := b.api(t, http.MethodPost, "/v1/admit", serviceToken, body)
	var out map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &out), raw)
	return status, out
}

var secretShown = regexp.MustCompile(`<code>(mgk_[A-Za-z0-9_-]+)</code>`)

// TestAChangedLimitRefusesTheNextAdmission: an org, a team and a key made in the console,
// a quota set on the team's page, and the next admission past it is refused at the team.
func TestAChangedLimitRefusesTheNextAdmission(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, token := b.member(t, staff.Support)
	admin, support := b.signedIn(t, adminToken), b.signedIn(t, token)
	org, team := b.id("org"), b.id("team")

	admin.get("/console/accounts")
	r := admin.post("/console/accounts", url.Values{"id": {org}, "kind": {"org"}, "plan": {"pro"}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	r = admin.post("/console/accounts", url.Values{"id": {team}, "kind": {"team"}, "parent": {org}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)

	support.get("/console/accounts/" + team)
	r = support.post("/console/accounts/"+team+"/keys", nil)
	require.Equal(t, http.StatusCreated, r.status, r.body)
	m := secretShown.FindStringSubmatch(r.body)
	require.NotNil(t, m, "the key's secret is shown once: %s", r.body)
	key := m[1]
	require.NotContains(t, support.get("/console/accounts/"+team).body, key, "and never again")

	// The node loads the new key within its policy reload.
	require.Eventually(t, func() bool {
		status, _ := b.admit(t, map[string]any{"api_key": key})
		return status != http.StatusUnauthorized
	}, 30*time.Second, 20*time.Millisecond)
	r = support.post("/console/accounts/"+team, url.Values{"plan": {""}, "quota.requests": {"2"}, "period.requests": {"month"},
		"rate.requests": {""}, "burst.requests": {""}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	page := support.get("/console/accounts/" + team)
	require.Contains(t, page.body, "override")
	require.NotContains(t, page.body, "0/s, burst 0", "a quota alone shows no rate")
	require.NotContains(t, page.body, `name="rate.requests" aria-label="requests rate per second" inputmode="decimal" size="8" value="0"`,
		"nor offers one to save back")

	for i := range 2 {
		status, _ := b.admit(t, map[string]any{"api_key": key})
		require.Equal(t, http.StatusOK, status, "admission %d within the quota", i)
	}
	status, reply := b.admit(t, map[string]any{"api_key": key})
	require.Equal(t, http.StatusPaymentRequired, status, "%v", reply)
	require.Equal(t, "quota_exceeded", reply["decision"])
	require.Equal(t, team, reply["blocked_by"].(map[string]any)["account"], "refused at the team, by the new quota")

	var audited int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from audit_log where route = '/v1/admin/accounts/{id}'
		and method = 'PUT' and before is not null and after is not null and after->'limits'->'requests'->>'quota' = '2'`).Scan(&audited))
	require.Equal(t, 1, audited, "the change is an audit row with its before and after")
}

// TestAccountChartReadsTodayLive: the account page's usage per day reads the billing log's
// daily rollup on every view: today's events and a late event of yesterday show at once.
func TestAccountChartReadsTodayLive(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	br := b.signedIn(t, adminToken)
	org := opsOrg(t, b, "org")
	now := time.Now().UTC()
	today, yesterday := now.Truncate(24*time.Hour), now.Truncate(24*time.Hour).AddDate(0, 0, -1)
	// Today's events at most a minute ago, and never before midnight.
	recent := func(d time.Duration) time.Time {
		if at := now.Add(-d); at.After(today) {
			return at
		}
		return today
	}
	opsEvents(t, b, org, yesterday.Add(time.Hour), time.Second, 2)
	opsEvents(t, b, org, recent(time.Minute), time.Second, 3)
	bar := func(day time.Time, n int) string {
		return fmt.Sprintf("<title>%s: %d</title>", day.Format(time.DateOnly), n)
	}

	r := br.get("/console/accounts/" + org)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, bar(yesterday, 2))
	require.Contains(t, r.body, bar(today, 3))

	opsEvents(t, b, org, recent(30*time.Second).Add(time.Millisecond), time.Second, 4) // ids differ from the first batch's
	opsEvents(t, b, org, yesterday.Add(2*time.Hour), time.Second, 5)
	r = br.get("/console/accounts/" + org)
	require.Contains(t, r.body, bar(today, 7), "today is read on every view")
	require.Contains(t, r.body, bar(yesterday, 7), "and so are the days before: a late event shows at once")
}

var grantKey = regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`)

// TestGrantsOnTheAccountPage: finance grants credits from an account's page once however
// often the form is sent, sees the balance, and voids the grant; support may do neither.
func TestGrantsOnTheAccountPage(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org := opsOrg(t, b, "org")
	_, finToken := b.member(t, staff.Finance)
	_, supToken := b.member(t, staff.Support)
	finance, support := b.signedIn(t, finToken), b.signedIn(t, supToken)

	r := support.get("/console/accounts/" + org)
	require.NotContains(t, r.body, "Grant credits", "support is offered no grant")
	r = support.post("/console/accounts/"+org+"/grants", url.Values{"unit": {"credits"}, "amount": {"500"}, "idempotency_key": {"k"}})
	require.Equal(t, http.StatusForbidden, r.status, r.body)

	r = finance.get("/console/accounts/" + org)
	require.Contains(t, r.body, "No credit grants.")
	m := grantKey.FindStringSubmatch(r.body)
	require.NotNil(t, m, r.body)
	form := url.Values{"unit": {"credits"}, "amount": {"500"}, "expires": {"2099-01-01"}, "source": {"promotional"},
		"idempotency_key": {m[1]}}
	for range 2 { // the same form twice: one grant
		r = finance.post("/console/accounts/"+org+"/grants", form)
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
	}
	var grants int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from credit_grants where account = $1`, org).Scan(&grants))
	require.Equal(t, 1, grants, "a form sent twice grants once")
	r = finance.get("/console/accounts/" + org)
	require.Regexp(t, `<td>credits</td><td class="n">500</td>`, r.body, "the balance")
	require.Contains(t, r.body, "<td>promotional</td>")
	require.Contains(t, r.body, "drawable")
	var grant string
	require.NoError(t, b.pool.QueryRow(b.ctx, `select id from credit_grants where account = $1`, org).Scan(&grant))

	r = support.post("/console/accounts/"+org+"/grants/"+grant+"/void", nil)
	require.Equal(t, http.StatusForbidden, r.status)
	r = finance.post("/console/accounts/"+org+"/grants/"+grant+"/void", nil)
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	r = finance.get("/console/accounts/" + org)
	require.Contains(t, r.body, `<span class="bad">voided</span>`)
}
