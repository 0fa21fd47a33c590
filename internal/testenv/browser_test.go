package testenv_test

import (
	"context"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// browserPages are the pages the browser tests open, by path.
var browserPages = map[string]string{
	// An image without a text alternative and a field without a label: two critical rules.
	"/violations": `<!doctype html><html lang="en"><head><title>Violations</title></head>
<body><main><h1>Violations</h1><img src="/missing.png"><form><input type="text" name="q"></form></main></body></html>`,
	// No landmark and no heading: moderate rules only.
	"/moderate": `<!doctype html><html lang="en"><head><title>Moderate</title></head>
<body><p>Nothing but a paragraph.</p></body></html>`,
	// Taller than the window, so that a full-page screenshot is taller than 900 pixels.
	"/clean": `<!doctype html><html lang="en"><head><title>Clean</title></head>
<body><main><h1>Clean</h1><img src="/missing.png" alt="A chart">
<form><label for="q">Search</label><input id="q" type="text" name="q"></form>
<p style="height: 2000px">A tall paragraph.</p></main></body></html>`,
	// Served with a policy that allows no script: its own inline script must not run.
	"/csp": `<!doctype html><html lang="en"><head><title>CSP</title></head>
<body><main><h1>CSP</h1><img src="/missing.png"><script>document.documentElement.dataset.ran = "yes"</script></main></body></html>`,
}

// strictCSP is the policy of /csp: no script of the page's own runs.
const strictCSP = "default-src 'self'; script-src 'none'"

// browserBundle is one browser and a server of browserPages.
type browserBundle struct {
	browser context.Context
	url     string
}

func setupBrowser(t *testing.T) *browserBundle {
	t.Helper()
	browser := testenv.Browser(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		page, ok := browserPages[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.URL.Path == "/csp" {
			w.Header().Set("Content-Security-Policy", strictCSP)
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, page)
	}))
	t.Cleanup(srv.Close)
	return &browserBundle{browser: browser, url: srv.URL}
}

// open shows path in a new tab of the bundle's browser, closed when t ends.
func (b *browserBundle) open(t *testing.T, path string) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(b.browser)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(tab)) // opens the tab, without a deadline that would close it
	ctx, cancelNav := context.WithTimeout(tab, 15*time.Second)
	defer cancelNav()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.url+path)))
	return tab
}

func ruleIDs(violations []testenv.AxeViolation) []string {
	ids := make([]string, 0, len(violations))
	for _, v := range violations {
		ids = append(ids, v.ID)
	}
	slices.Sort(ids)
	return ids
}

func violation(t *testing.T, violations []testenv.AxeViolation, id string) testenv.AxeViolation {
	t.Helper()
	for _, v := range violations {
		if v.ID == id {
			return v
		}
	}
	t.Fatalf("no violation of %s among %v", id, ruleIDs(violations))
	return testenv.AxeViolation{}
}

// fakeTB records what RequireAccessible reports, and ends its goroutine where a test would
// stop.
type fakeTB struct {
	testing.TB
	failed, skipped bool
	msg             string
}

func (f *fakeTB) Helper()             {}
func (f *fakeTB) Logf(string, ...any) {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Skip(args ...any) {
	f.skipped, f.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}

// requireAccessible runs RequireAccessible on a fakeTB and returns it; it skips t where
// RequireAccessible skipped (no axe-core).
func requireAccessible(t *testing.T, ctx context.Context, page string) *fakeTB {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testenv.RequireAccessible(f, ctx, page)
	}()
	<-done
	if f.skipped {
		t.Skip(f.msg)
	}
	return f
}

// TestBrowser starts one Chromium and gives each subtest a tab of it.
func TestBrowser(t *testing.T) {
	b := setupBrowser(t)

	t.Run("AxeReportsViolations", func(t *testing.T) {
		got := testenv.Axe(t, b.open(t, "/violations"))
		img := violation(t, got, "image-alt")
		require.Equal(t, "critical", img.Impact)
		require.Len(t, img.Nodes, 1)
		require.Equal(t, "img", img.Nodes[0].Target)
		require.Contains(t, img.Nodes[0].HTML, `src="/missing.png"`)
		require.Equal(t, "critical", violation(t, got, "label").Impact)
		require.NotEmpty(t, img.Help)
	})

	t.Run("AxeCleanPage", func(t *testing.T) {
		require.Empty(t, testenv.Axe(t, b.open(t, "/clean")))
	})

	t.Run("AxeUnderStrictCSP", func(t *testing.T) {
		tab := b.open(t, "/csp")
		// The policy is in force: the page's own script did not run.
		ran, err := chromedp.Run(tab, chromedp.Evaluate[*string](`document.documentElement.dataset.ran ?? null`))
		require.NoError(t, err)
		require.Nil(t, ran, "the page's inline script ran: the CSP was not applied")
		require.Equal(t, "critical", violation(t, testenv.Axe(t, tab), "image-alt").Impact)
	})

	t.Run("RequireAccessible", func(t *testing.T) {
		f := requireAccessible(t, b.open(t, "/violations"), "violations page")
		require.True(t, f.failed, "RequireAccessible passed a page with critical violations")
		require.Contains(t, f.msg, "violations page: 2 serious or critical")
		require.Contains(t, f.msg, "[critical] image-alt: ")
		require.Contains(t, f.msg, `img  <img src="/missing.png">`)
		require.Contains(t, f.msg, "[critical] label: ")

		// Moderate violations alone do not fail it.
		tab := b.open(t, "/moderate")
		got := testenv.Axe(t, tab)
		require.Contains(t, ruleIDs(got), "region")
		for _, v := range got {
			require.Contains(t, []string{"minor", "moderate"}, v.Impact, v.ID)
		}
		f = requireAccessible(t, tab, "moderate page")
		require.False(t, f.failed, f.msg)
	})

	t.Run("Screenshot", func(t *testing.T) {
		tab := b.open(t, "/clean")
		want := filepath.Join(t.TempDir(), "docs", "console", "clean.png")

		t.Setenv("METERGATE_SCREENSHOTS", "")
		path := testenv.Screenshot(t, tab, want)
		require.NotEqual(t, want, path, "written to the docs without METERGATE_SCREENSHOTS=1")
		require.Equal(t, "clean.png", filepath.Base(path))
		requireFullPagePNG(t, path)

		t.Setenv("METERGATE_SCREENSHOTS", "1")
		require.Equal(t, want, testenv.Screenshot(t, tab, want))
		requireFullPagePNG(t, want)
	})

	t.Run("TabsShareTheBrowser", func(t *testing.T) {
		first, second := b.open(t, "/clean"), b.open(t, "/moderate")
		require.Same(t, chromedp.FromContext(b.browser).Browser, chromedp.FromContext(first).Browser)
		require.Same(t, chromedp.FromContext(first).Browser, chromedp.FromContext(second).Browser)
		title, err := chromedp.Run(second, chromedp.Title())
		require.NoError(t, err)
		require.Equal(t, "Moderate", title)
		title, err = chromedp.Run(first, chromedp.Title())
		require.NoError(t, err)
		require.Equal(t, "Clean", title)
	})
}

// requireFullPagePNG checks that path is a PNG of the window's width and of the whole
// height of /clean, not only the window's 900 pixels.
func requireFullPagePNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	require.NoError(t, err, "%s is not a PNG", path)
	require.Equal(t, 1280, cfg.Width)
	require.Greater(t, cfg.Height, 2000)
	require.True(t, strings.HasSuffix(path, ".png"))
}
