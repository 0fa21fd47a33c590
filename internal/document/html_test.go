package document

import (
	"bytes"
	"html"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func renderHTML(t *testing.T, d Document) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, HTML(&b, d))
	return b.String()
}

func TestHTML(t *testing.T) {
	t.Parallel()
	d := fixture()
	page := renderHTML(t, d)
	for _, want := range expected(d) {
		require.Contains(t, page, html.EscapeString(want))
	}
	require.Contains(t, page, "Müller &amp; Søn GmbH")
	require.Contains(t, page, "Büro €uro")
	require.Contains(t, page, "<title>Invoice MG-2026-000123</title>")
	require.Contains(t, page, "Late requests of 2026-09 by acme/team-a")
	require.Contains(t, page, `<tr class="breakdown"><td>requests paid with prepaid credits</td>`)
	require.Contains(t, page, "2026-12-01") // due
	require.NotContains(t, page, `class="stamp"`)
	require.NotContains(t, page, "<script")
}

func TestHTMLEscapes(t *testing.T) {
	t.Parallel()
	d := fixture()
	d.Buyer.LegalName = `<script>alert("x")</script>`
	d.Lines[1].AccountPath = `acme/<img src=x onerror=alert(1)>`
	page := renderHTML(t, d)
	require.NotContains(t, page, "<script>")
	require.NotContains(t, page, "<img")
	require.Contains(t, page, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
}

func TestHTMLStatusAndCreditNote(t *testing.T) {
	t.Parallel()
	d := fixture()
	d.Status = "void"
	require.Contains(t, renderHTML(t, d), `<span class="stamp">VOID</span>`)

	d = fixture()
	d.Kind, d.Number, d.DueAt, d.Buyer = KindCreditNote, "MG-CN-2026-000004", time.Time{}, nil
	d.Refs = []Ref{{Label: "Credits invoice", Number: "MG-2026-000123"}}
	d.Reason = "Voided: wrong billing address"
	page := renderHTML(t, d)
	require.Contains(t, page, "<h1>Credit note MG-CN-2026-000004</h1>")
	require.Contains(t, page, "<dt>Credits invoice</dt><dd>MG-2026-000123</dd>")
	require.Contains(t, page, "Voided: wrong billing address")
	require.Contains(t, page, `<h2>Bill to</h2><p>acme</p>`)
	require.NotContains(t, page, "<dt>Due</dt>")
}
