package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Browser returns a chromedp context on a headless Chromium of this test alone, started
// from $CHROMIUM or else /usr/bin/chromium (Debian's chromium, which make up installs) with
// a fresh temporary profile and a 1280x900 window, and closed when the test ends. Without
// Chromium the test is skipped, or fails where services are required (SkipOrFail).
//
// The context is the browser's first tab. chromedp.NewContext(ctx) opens another tab in
// the same browser; cancel it to close the tab. Actions that should not outlive a deadline
// run on a context.WithTimeout of the tab's context: a deadline on the returned context
// itself would end the browser.
func Browser(tb testing.TB) context.Context {
	tb.Helper()
	exe := os.Getenv("CHROMIUM")
	if exe == "" {
		exe = "/usr/bin/chromium"
	}
	path, err := exec.LookPath(exe)
	if err != nil {
		SkipOrFail(tb, fmt.Sprintf("Chromium not found (%v): run `make up` (it installs Debian's chromium) or set CHROMIUM", err))
	}
	var output lockedBuffer
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // as root, and in containers, Chromium's sandbox cannot start
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(1280, 900),
		// No user-data-dir: chromedp makes a fresh temporary one and, when the browser
		// ends, kills the helpers still using it and deletes it.
		chromedp.CombinedOutput(&output),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	// The first action starts the browser: now, so that a tab opened from ctx shares it.
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		cancelAlloc()
		tb.Fatalf("start Chromium %s: %v\n%s", path, err, output.tail(2000))
	}
	tb.Cleanup(func() {
		closeCtx, cancelClose := context.WithTimeout(ctx, 10*time.Second)
		defer cancelClose()
		// Cancel closes the browser gracefully and cancels ctx; cancel, which waits for
		// the browser to be gone, only when Cancel could not.
		if err := chromedp.Cancel(closeCtx); err != nil {
			tb.Logf("close Chromium: %v", err)
			cancel()
		}
		cancelAlloc()
	})
	return ctx
}

// lockedBuffer keeps what the browser prints, written from chromedp's goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// tail returns the last n bytes written.
func (b *lockedBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// AxeViolation is one rule of axe-core that the page breaks.
type AxeViolation struct {
	ID      string    `json:"id"`     // the rule, e.g. "image-alt"
	Impact  string    `json:"impact"` // minor, moderate, serious or critical
	Help    string    `json:"help"`
	HelpURL string    `json:"helpUrl"`
	Nodes   []AxeNode `json:"nodes"`
}

// AxeNode is one element of the page that breaks a rule.
type AxeNode struct {
	Target string `json:"target"` // a CSS selector of the element (" >>> " enters a frame or shadow root)
	HTML   string `json:"html"`   // the element's opening tag, as axe-core quotes it
}

// axeScript is the text of axe.min.js, read once per test process.
var axeScript = sync.OnceValues(func() (string, error) {
	path := os.Getenv("METERGATE_AXE")
	if path == "" {
		return "", errors.New("METERGATE_AXE is not set")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return string(b), nil
})

// axeRun runs every rule and keeps of the violations what a report needs.
const axeRun = `axe.run(document, {resultTypes: ["violations"]}).then(r => r.violations.map(v => ({
	id: v.id, impact: v.impact || "", help: v.help, helpUrl: v.helpUrl,
	nodes: v.nodes.map(n => ({
		target: n.target.map(t => Array.isArray(t) ? t.join(" >>> ") : t).join(" >>> "),
		html: n.html,
	})),
})))`

// Axe runs axe-core's rules on the page that ctx (a tab of Browser) shows and returns the
// violations. axe.min.js comes from METERGATE_AXE (make up fetches it); without it the test
// is skipped, or fails where services are required. The script is evaluated through the
// DevTools protocol, which the page's Content-Security-Policy does not govern, so a page
// that allows no script at all is checked too.
func Axe(tb testing.TB, ctx context.Context) []AxeViolation { //nolint:revive // context-as-argument: a test helper takes tb first, as in the tests
	tb.Helper()
	script, err := axeScript()
	if err != nil {
		Unavailable(tb, "axe-core", "METERGATE_AXE", err.Error())
	}
	loaded, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`typeof window.axe === "object"`))
	if err != nil {
		tb.Fatalf("axe: look for axe-core in the page: %v", err)
	}
	if !loaded {
		if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](script)); err != nil {
			tb.Fatalf("axe: inject axe-core: %v", err)
		}
	}
	violations, err := chromedp.Run(ctx, chromedp.Evaluate[[]AxeViolation](axeRun, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.Fatalf("axe: run: %v", err)
	}
	return violations
}

// RequireAccessible fails the test if the page that ctx shows (named page in the message)
// breaks any rule of axe-core whose impact is serious or critical, listing each rule with
// the elements that break it. Minor and moderate violations are logged.
func RequireAccessible(tb testing.TB, ctx context.Context, page string) { //nolint:revive // context-as-argument: a test helper takes tb first, as in the tests
	tb.Helper()
	var blocking, other []AxeViolation
	for _, v := range Axe(tb, ctx) {
		if v.Impact == "serious" || v.Impact == "critical" {
			blocking = append(blocking, v)
		} else {
			other = append(other, v)
		}
	}
	if len(other) > 0 {
		tb.Logf("%s: accessibility, not blocking:\n%s", page, FormatViolations(other))
	}
	if len(blocking) > 0 {
		tb.Fatalf("%s: %d serious or critical accessibility violations:\n%s", page, len(blocking), FormatViolations(blocking))
	}
}

// FormatViolations renders violations one rule a paragraph: impact, rule, help, link, then
// each element's selector and tag.
func FormatViolations(violations []AxeViolation) string {
	var b strings.Builder
	for _, v := range violations {
		fmt.Fprintf(&b, "  [%s] %s: %s (%s)\n", v.Impact, v.ID, v.Help, v.HelpURL)
		for _, n := range v.Nodes {
			fmt.Fprintf(&b, "      %s  %s\n", n.Target, n.HTML)
		}
	}
	return b.String()
}

// Screenshot saves a full-page PNG of what ctx shows and returns where. With
// METERGATE_SCREENSHOTS=1 it writes path, relative to the module's root unless absolute
// (docs/console/accounts.png), creating its folders: that is how the docs' screenshots are
// renewed. Otherwise it writes path's file name in the test's temporary folder, so that
// ordinary runs check that screenshots work without changing the docs.
func Screenshot(tb testing.TB, ctx context.Context, path string) string { //nolint:revive // context-as-argument: a test helper takes tb first, as in the tests
	tb.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		tb.Fatalf("screenshot %s: %v", path, err)
	}
	switch {
	case os.Getenv("METERGATE_SCREENSHOTS") != "1":
		path = filepath.Join(tb.TempDir(), filepath.Base(path))
	case !filepath.IsAbs(path):
		root, err := moduleRoot()
		if err != nil {
			tb.Fatalf("screenshot %s: %v", path, err)
		}
		path = filepath.Join(root, path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		tb.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.Fatalf("screenshot: %v", err)
	}
	return path
}

// moduleRoot is the nearest folder above the working directory that holds go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test's directory")
		}
		dir = parent
	}
}
