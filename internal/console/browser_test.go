package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/staff"
	"github.com/metergate/metergate/internal/testenv"
)

// tab is a browser tab on the console of b.
type tab struct {
	t   *testing.T
	b   *testBundle
	ctx context.Context
}

// tab opens a browser of its own on the console: a tab opened beside another with
// chromedp.NewContext does not answer evaluations here (chromedp v0.23).
func (b *testBundle) tab(t *testing.T) *tab {
	return &tab{t: t, b: b, ctx: testenv.Browser(t)}
}

// run runs actions within a minute.
func (tb *tab) run(actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, time.Minute)
	defer cancel()
	require.NoError(tb.t, chromedp.Do(ctx, actions...))
}

// value runs an action that returns a value, within a minute.
func value[T any](tb *tab, a chromedp.Action[T]) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	require.NoError(tb.t, err)
	return v
}

// open goes to a console path and waits for its heading.
func (tb *tab) open(path string) {
	tb.t.Helper()
	tb.run(chromedp.Navigate(tb.b.url+path), chromedp.WaitVisible(chromedp.CSS("main h1")))
}

// text is the visible text of the page's main.
func (tb *tab) text() string {
	tb.t.Helper()
	return value(tb, chromedp.Evaluate[string](`document.querySelector("main").innerText`))
}

// submit fills the form's fields (CSS selector → value) and clicks its button, then
// waits for the next page.
func (tb *tab) submit(button string, fields map[string]string) {
	tb.t.Helper()
	var actions []chromedp.Action[chromedp.Void]
	for sel, v := range fields {
		// Typed values would go through key events; setting them is as good for a form.
		js, err := json.Marshal(map[string]string{"sel": sel, "v": v})
		require.NoError(tb.t, err)
		actions = append(actions, chromedp.Evaluate[chromedp.Void](
			`(f => { const e = document.querySelector(f.sel); if (!e) throw new Error("no " + f.sel); e.value = f.v; })(`+string(js)+`)`))
	}
	// The page is marked, so that the wait below is for the next one.
	actions = append(actions, chromedp.Evaluate[chromedp.Void](`document.documentElement.dataset.page = "before"`),
		chromedp.Click(chromedp.CSS(button)))
	tb.run(actions...)
	tb.next()
}

// next waits for the page that follows the marked one to load: polled from here, as an
// evaluation in the page dies with it.
func (tb *tab) next() {
	tb.t.Helper()
	require.Eventually(tb.t, func() bool {
		ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
		defer cancel()
		state, err := chromedp.Run(ctx, chromedp.Evaluate[string](
			`document.documentElement.dataset.page === "before" ? "old" : document.readyState`))
		return err == nil && state == "complete"
	}, time.Minute, 20*time.Millisecond, "the next page loads")
	tb.run(chromedp.WaitVisible(chromedp.CSS("main h1")))
}

// check is the accessibility check and the screenshot of the page, as docs/console/name.png.
func (tb *tab) check(name string) {
	tb.t.Helper()
	testenv.RequireAccessible(tb.t, tb.ctx, name)
	testenv.Screenshot(tb.t, tb.ctx, "docs/console/"+name+".png")
}

// TestConsoleInABrowser drives the console in a real Chromium as its users do: sign in;
// make an org, a team and a key; change the team's limit and see the next admission
// refused by it; find a 429 by its idempotency key on "Why?"; void an invoice and
// download its credit note; and as a viewer, find no form to write with and be refused
// a forged one. Each page passes axe-core's check, and its screenshot is taken.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// Plain names: the test has a schema and a Redis key prefix of its own.
	org, team := "globex", "research"

	// Sign in with the admin token.
	admin := b.tab(t)
	admin.open("/console/accounts")
	require.Contains(t, admin.text(), "Staff token")
	admin.check("login")
	admin.submit("main form button", map[string]string{"#token": adminToken})
	require.Contains(t, admin.text(), "New account")

	// An org and a team.
	admin.submit(`form[method="post"][action="/console/accounts"] button`, map[string]string{
		`input[name="id"]`: org, `select[name="kind"]`: "org", `select[name="plan"]`: "pro"})
	require.Contains(t, admin.text(), "org "+org)
	admin.open("/console/accounts")
	admin.submit(`form[method="post"][action="/console/accounts"] button`, map[string]string{
		`input[name="id"]`: team, `select[name="kind"]`: "team", `input[name="parent"]`: org})
	require.Contains(t, admin.text(), "team "+team)

	// A key, its secret shown once.
	admin.submit(`form[action$="/keys"] button`, nil)
	secret := value(admin, chromedp.Evaluate[string](`document.querySelector(".secret p:nth-of-type(2) code").innerText`))
	require.True(t, strings.HasPrefix(secret, "mgk_"), secret)
	admin.check("account-new-key")

	// A quota of 2 requests a month on the team, then the third admission is refused by it.
	admin.submit(`form[action="/console/accounts/`+team+`"] button`, map[string]string{
		`input[name="quota.requests"]`: "2", `select[name="period.requests"]`: "month"})
	require.Contains(t, admin.text(), "override")
	require.Eventually(t, func() bool {
		status, _ := b.admit(t, map[string]any{"api_key": secret, "units": map[string]any{"requests": 0}})
		return status != http.StatusUnauthorized
	}, 30*time.Second, 20*time.Millisecond, "the node loads the new key")
	for range 2 {
		status, reply := b.admit(t, map[string]any{"api_key": secret})
		require.Equal(t, http.StatusOK, status, "%v", reply)
	}
	status, reply := b.admit(t, map[string]any{"api_key": secret})
	require.Equal(t, http.StatusPaymentRequired, status, "%v", reply)
	require.Equal(t, team, reply["blocked_by"].(map[string]any)["account"])
	admin.open("/console/accounts/" + team)
	require.Contains(t, admin.text(), "100%", "the usage bar is full")
	admin.check("account")
	admin.open("/console/accounts/" + org)
	admin.check("account-org")
	admin.open("/console/accounts?q=re")
	require.Contains(t, admin.text(), team)
	admin.check("accounts")

	// A rate limit instead of the quota: a request past it is refused 429, and "Why?"
	// finds that refusal by its idempotency key.
	admin.open("/console/accounts/" + team)
	admin.submit(`form[action="/console/accounts/`+team+`"] button`, map[string]string{
		`input[name="quota.requests"]`: "", `input[name="rate.requests"]`: "0.001", `input[name="burst.requests"]`: "1"})
	require.Contains(t, admin.text(), "0.001/s, burst 1")
	status, reply = b.admit(t, map[string]any{"api_key": secret, "idempotency_key": "first-of-the-day"})
	require.Equal(t, http.StatusOK, status, "%v", reply)
	status, reply = b.admit(t, map[string]any{"api_key": secret, "idempotency_key": "order-4711-retry-2"})
	require.Equal(t, http.StatusTooManyRequests, status, "%v", reply)
	require.Eventually(t, func() bool {
		admin.open("/console/why?q=order-4711-retry-2&account=" + team)
		return strings.Contains(admin.text(), "rate_limited")
	}, 30*time.Second, 100*time.Millisecond, "the refusal reaches the log")
	require.Regexp(t, `429\s+rate_limited\s+`+team+` \(team\)\s+requests`, admin.text())
	admin.check("why")

	// Finance voids an invoice, then downloads the credit note.
	inv := b.invoiced(t, "Acme Widgets GmbH")
	_, token := b.member(t, staff.Finance)
	finance := b.tab(t)
	finance.open("/console/login?next=/console/invoices/" + strconv.FormatInt(inv.ID, 10))
	finance.submit("main form button", map[string]string{"#token": token})
	require.Contains(t, finance.text(), inv.Number)
	finance.check("invoice")
	finance.run(chromedp.Evaluate[chromedp.Void](`document.documentElement.dataset.page = "before"`),
		chromedp.Click(chromedp.CSS(`a[href$="/void"]`)))
	finance.next()
	finance.check("invoice-void")
	finance.submit(`main form button`, map[string]string{"#reason": "Billed twice: see ticket 4711"})
	require.Contains(t, finance.text(), "This invoice is void")
	finance.run(chromedp.Evaluate[chromedp.Void](`document.documentElement.dataset.page = "before"`),
		chromedp.Click(chromedp.CSS(`a[href^="/console/credit-notes/"]`)))
	finance.next()
	require.Contains(t, finance.text(), "Billed twice: see ticket 4711")
	finance.check("credit-note")
	downloads := t.TempDir()
	_, err := chromedp.CallBrowser(finance.ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
		Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads})
	require.NoError(t, err)
	finance.run(chromedp.Click(chromedp.CSS(`a[href$="/pdf"]`)))
	var pdf []byte
	require.Eventually(t, func() bool {
		files, _ := filepath.Glob(filepath.Join(downloads, "*.pdf"))
		if len(files) != 1 {
			return false
		}
		pdf, err = os.ReadFile(files[0])
		return err == nil && bytes.HasSuffix(bytes.TrimSpace(pdf), []byte("%%EOF"))
	}, 30*time.Second, 50*time.Millisecond, "the credit note's PDF downloads")
	require.True(t, bytes.HasPrefix(pdf, []byte("%PDF-")))
	require.Contains(t, strings.Join(testenv.PDFText(t, pdf), "\n"), "Billed twice: see ticket 4711")

	// Every other page, as an admin sees it.
	for name, path := range map[string]string{"overview": "/console/", "plans": "/console/plans",
		"plan": "/console/plans/pro", "invoices": "/console/invoices", "credit-notes": "/console/credit-notes",
		"runs": "/console/runs", "dead-letters": "/console/dead-letters", "webhooks": "/console/webhooks",
		"audit": "/console/audit", "staff": "/console/staff", "sessions": "/console/sessions"} {
		admin.open(path)
		admin.check(name)
	}

	// A viewer finds no form that writes, and a forged one is refused.
	_, token = b.member(t, staff.Viewer)
	viewer := b.tab(t)
	viewer.open("/console/login?next=/console/why")
	viewer.submit("main form button", map[string]string{"#token": token})
	viewer.open("/console/accounts/" + team)
	forms := value(viewer, chromedp.Evaluate[int](`document.querySelectorAll('main form[method="post"]').length`))
	require.Zero(t, forms, "a viewer is offered no write")
	csrf := value(viewer, chromedp.Evaluate[string](`document.querySelector('header input[name="csrf"]').value`))
	viewer.run(chromedp.Evaluate[chromedp.Void](`document.documentElement.dataset.page = "before"`))
	viewer.run(chromedp.Evaluate[chromedp.Void](`(() => { const f = document.createElement("form"); f.method = "post";
		f.action = "/console/accounts/` + team + `/keys"; const i = document.createElement("input"); i.name = "csrf";
		i.value = "` + csrf + `"; f.appendChild(i); document.body.appendChild(f); f.submit(); })()`))
	viewer.next()
	require.Contains(t, viewer.text(), "may not do this")
	var keys int
	require.NoError(t, b.pool.QueryRow(b.ctx, `select count(*) from api_keys where account = $1`, team).Scan(&keys))
	require.Equal(t, 1, keys, "the viewer made no key")
}
