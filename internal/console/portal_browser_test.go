package console_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/testenv"
)

// portalCheck is the accessibility check and the screenshot of the page, as
// docs/portal/name.png.
func (tb *tab) portalCheck(name string) {
	tb.t.Helper()
	testenv.RequireAccessible(tb.t, tb.ctx, "portal "+name)
	testenv.Screenshot(tb.t, tb.ctx, "docs/portal/"+name+".png")
}

// TestPortalInABrowser drives the portal in a real Chromium as a customer does: open the
// link the operator's backend asked for; read the overview's usage, limits and balance;
// open a team, add a user below it and set the user's quota; make an API key (its secret
// shown once); read the invoices and an invoice; sign out. A used link gets an error page.
// Each page passes axe-core's check, and its screenshot is taken.
func TestPortalInABrowser(t *testing.T) {
	t.Parallel()
	b := setupPortal(t)
	// Plain names: the test has a schema and a Redis key prefix of its own.
	org, team, other := "acme", "acme-ml", "acme-ops"
	inv := b.invoicedOrg(t, org, "Acme Widgets GmbH")
	b.adminCall(t, http.MethodPut, "/v1/admin/accounts/"+org, map[string]any{"kind": "org", "parent": "", "plan": "pro",
		"limits": map[string]any{"requests": map[string]any{"quota": 100000, "quota_period": "month"},
			"tokens": map[string]any{"quota": 5_000_000, "quota_period": "month"}}})
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts", map[string]any{"id": team, "kind": "team", "parent": org})
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts", map[string]any{"id": other, "kind": "team", "parent": org})
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts/"+org+"/grants",
		map[string]any{"unit": "credits", "amount": 250_000, "source": "purchase", "idempotency_key": "browser-grant"})
	b.resolvable(t, org, team, other)
	// A year of usage, more of it this month: the team's every few hours, the other's less.
	now := time.Now().UTC()
	var uses []use
	for d := 0; d < 365; d += 9 {
		uses = append(uses, use{[]string{org, team}, now.AddDate(0, 0, -d).Add(-time.Hour), int64(20_000 + 300*d)})
	}
	for h := 1; h < now.Day()*24; h += 7 {
		uses = append(uses, use{[]string{org, team}, now.Add(-time.Duration(h) * time.Hour), int64(9_000 + h*40)})
		if h%3 == 0 {
			uses = append(uses, use{[]string{org, other}, now.Add(-time.Duration(h) * time.Hour), 4_000})
		}
	}
	b.used(t, uses...)

	// And what admission counted this month, live in Redis.
	for range 12 {
		status, reply := b.admit(t, map[string]any{"account": team, "units": map[string]any{"tokens": 180_000}})
		require.Equal(t, http.StatusOK, status, "%v", reply)
	}

	customerTab := &tab{t: t, b: b.testBundle, ctx: testenv.Browser(t)}
	link := b.link(t, org, customer.Scopes...)
	customerTab.open(link)
	text := customerTab.text()
	require.Contains(t, text, "Overview of "+org)
	require.Contains(t, text, "What remains now")
	require.Contains(t, text, "Prepaid credits")
	customerTab.portalCheck("overview")

	// A team, a user below it, and the user's quota.
	customerTab.open("/portal/accounts/" + team)
	require.Contains(t, customerTab.text(), "team "+team)
	customerTab.portalCheck("account")
	customerTab.submit(`form[action$="/children"] button`, map[string]string{`input[name="id"]`: "ada", `select[name="kind"]`: "user"})
	require.Contains(t, customerTab.text(), "user ada")
	b.resolvable(t, "ada")
	customerTab.submit(`form[action$="/limits"] button`, map[string]string{`input[name="quota.tokens"]`: "200000"})
	require.Regexp(t, `ada\s+tokens\s+—\s+200 000`, customerTab.text(), "the user's quota shows")
	customerTab.portalCheck("account-new")

	// An API key, its secret shown once.
	customerTab.open("/portal/accounts/" + team + "/keys")
	customerTab.submit(`form[action$="/keys"] button`, nil)
	secret := value(customerTab, chromedp.Evaluate[string](`document.querySelector(".secret p:nth-of-type(2) code").innerText`))
	require.True(t, strings.HasPrefix(secret, "mgk_"), secret)
	customerTab.portalCheck("keys")

	// The invoices, an invoice, and its PDF's link.
	customerTab.open("/portal/invoices")
	require.Contains(t, customerTab.text(), inv.Number)
	customerTab.portalCheck("invoices")
	customerTab.open("/portal/invoices/" + strconv.FormatInt(inv.ID, 10))
	require.Contains(t, customerTab.text(), "Acme Widgets GmbH")
	customerTab.portalCheck("invoice")

	// Signing out, and the link again.
	customerTab.submit(`form[action="/portal/sign-out"] button`, nil)
	require.Contains(t, customerTab.text(), "You have signed out")
	customerTab.portalCheck("signed-out")
	customerTab.open(link)
	require.Contains(t, customerTab.text(), "opened already")
	customerTab.portalCheck("link-used")

	// A usage:read session of the team is offered no write at all.
	readerTab := &tab{t: t, b: b.testBundle, ctx: testenv.Browser(t)}
	readerTab.open(b.link(t, team, customer.UsageRead))
	forms := value(readerTab, chromedp.Evaluate[int](`document.querySelectorAll('main form[method="post"]').length`))
	require.Zero(t, forms, "a usage:read session is offered no write")
	require.NotContains(t, readerTab.text(), "Prepaid credits")
}
