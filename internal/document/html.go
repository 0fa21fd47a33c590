package document

import (
	_ "embed" // the page template
	"fmt"
	"html/template"
	"io"
)

//go:embed document.html.tmpl
var pageTemplate string

// page is one self-contained HTML page: inline CSS, no scripts, no external assets, every
// text escaped by html/template.
var page = template.Must(template.New("document").Parse(pageTemplate))

// HTML writes d as a self-contained HTML page.
func HTML(w io.Writer, d Document) error {
	if err := page.Execute(w, newView(d)); err != nil {
		return fmt.Errorf("render %s as HTML: %w", d.Title(), err)
	}
	return nil
}
