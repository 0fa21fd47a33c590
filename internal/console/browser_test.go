package console_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

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
		if strings.HasPrefix(sel, "select") {
			actions = append(actions, chromedp.SetValue(chromedp.CSS(sel), v))
			continue
		}
		actions = append(actions, chromedp.Clear(chromedp.CSS(sel)), chromedp.SendKeys(chromedp.CSS(sel), v))
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
// refused by it; and as a viewer, find no form to write with and be refused a forged
// one. Each page passes axe-core's check, and its screenshot is taken.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	org, team := b.id("acme"), b.id("research")

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
	admin.open("/console/accounts?q=" + b.prefix)
	require.Contains(t, admin.text(), team)
	admin.check("accounts")

	// A viewer finds no form that writes, and a forged one is refused.
	_, token := b.member(t, staff.Viewer)
	viewer := b.tab(t)
	viewer.open("/console/login")
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
