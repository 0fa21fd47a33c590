package console

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/document"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// pages are the templates, one per page: the layout with the page's "content".
var pages = parsePages()

var funcs = template.FuncMap{
	"money": document.FormatMinor,
	"num":   formatNum,
	"time":  formatTime,
	"date":  func(t time.Time) string { return t.UTC().Format("2006-01-02") },
	"ago":   ago,
	"pct": func(part, whole int64) int64 {
		if whole <= 0 {
			return 0
		}
		return int64(math.Round(100 * float64(part) / float64(whole)))
	},
	"join": strings.Join,
	"derefTime": func(t *time.Time) time.Time {
		if t == nil {
			return time.Time{}
		}
		return *t
	},
	"deref": func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	},
	"add": func(a, b int) int { return a + b },
}

func parsePages() map[string]*template.Template {
	layout := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFiles,
		"templates/layout.html", "templates/partials.html"))
	names, err := fs.Glob(templateFiles, "templates/*.html")
	if err != nil {
		panic(err)
	}
	out := map[string]*template.Template{}
	for _, name := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(name, "templates/"), ".html")
		if base == "layout" || base == "partials" || strings.HasPrefix(base, "portal_") { // the portal's (portal.go)
			continue
		}
		out[base] = template.Must(template.Must(layout.Clone()).ParseFS(templateFiles, name))
	}
	return out
}

// render writes page name with data, in the layout, with status.
func (c *Console) render(w http.ResponseWriter, _ *http.Request, v *view, status int, name string, data any) {
	t, ok := pages[name]
	if !ok {
		panic("console: no page " + name)
	}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, "layout.html", struct {
		*view
		Data any
	}{v, data}); err != nil {
		c.cfg.Log.Error("render console page", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = b.WriteTo(w)
}

// formatNum writes n with thin groups of three digits: 1 234 567.
func formatNum(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune('\u202f')
		}
		b.WriteRune(r)
	}
	if neg {
		return "−" + b.String()
	}
	return b.String()
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// ago is how long ago t was, roughly: "3 min ago".
func ago(t time.Time) string {
	d := time.Since(t)
	switch {
	case t.IsZero():
		return "never"
	case d < time.Minute:
		return fmt.Sprintf("%d s ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	}
	return fmt.Sprintf("%d days ago", int(d.Hours()/24))
}

// chart is a bar chart drawn as inline SVG (no script): one bar per point.
type chart struct {
	Title   string
	Caption string
	Unit    string
	Bars    []bar
	Max     int64
	Width   int
	Height  int
}

type bar struct {
	Label  string // e.g. the day
	Value  int64
	X, Y   int // the bar's top left, in the SVG's units
	W, H   int
	Legend bool // whether the label is drawn under the bar
	LabelY int  // where the label's baseline is
}

// newChart lays out values (label → value, in order) as bars in a 720 × 160 box.
func newChart(title, unit string, labels []string, values []int64) chart {
	const width, height, top, bottom = 720, 160, 10, 20
	c := chart{Title: title, Unit: unit, Width: width, Height: height}
	for _, v := range values {
		c.Max = max(c.Max, v)
	}
	n := len(values)
	if n == 0 {
		return c
	}
	step := width / n
	every := max(1, n/8)
	for i, v := range values {
		h := 0
		if c.Max > 0 {
			h = int(float64(height-top-bottom) * float64(v) / float64(c.Max))
		}
		c.Bars = append(c.Bars, bar{Label: labels[i], Value: v, X: i * step, Y: height - bottom - h,
			W: max(1, step-2), H: h, Legend: i%every == 0, LabelY: height - 6})
	}
	return c
}

// static serves the console's stylesheet, its one asset.
func static(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("file") != "console.css" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Cache-Control", "public, max-age=3600")
	http.ServeFileFS(w, r, staticFiles, "static/console.css")
}
