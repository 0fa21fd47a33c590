package document

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

func renderPDF(t *testing.T, d Document) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, PDF(&b, d))
	return b.Bytes()
}

func pdfText(t *testing.T, pdf []byte) []string { return testenv.PDFText(t, pdf) }

func TestPDFIsByteStable(t *testing.T) {
	t.Parallel()
	d := fixture()
	first := renderPDF(t, d)
	require.Equal(t, first, renderPDF(t, d))
	// Both dates are the issue's, not the render's: a second render in another second
	// gives the same bytes too.
	require.Equal(t, 2, bytes.Count(first, []byte("(D:20261101000500)")), "CreationDate and ModDate")

	d.IssuedAt = d.IssuedAt.AddDate(0, 0, 1)
	require.NotEqual(t, first, renderPDF(t, d))
}

func TestPDFText(t *testing.T) {
	t.Parallel()
	d := fixture()
	d.Status = "paid"
	text := strings.Join(pdfText(t, renderPDF(t, d)), "\n")
	for _, want := range expected(d) {
		require.Contains(t, text, want)
	}
	for _, want := range []string{"Müller & Søn GmbH", "Büro €uro", "Königstraße 12", "PAID", "Due", "2026-12-01",
		"requests paid with prepaid credits", "Late requests of 2026-09 by acme/team-a", NoAmount} {
		require.Contains(t, text, want)
	}
}

func TestPDFReplacesWhatTheFontLacks(t *testing.T) {
	t.Parallel()
	d := fixture()
	d.Buyer.LegalName = "Łódź 日本 Ünal\tAB"
	d.Kind, d.Number, d.Buyer.Address = KindCreditNote, "MG-CN-2026-000004", nil
	d.Refs = []Ref{{Label: "Credits invoice", Number: "MG-2026-000123"}}
	d.Reason = "Wrong address → reissued"
	text := strings.Join(pdfText(t, renderPDF(t, d)), "\n")
	require.Contains(t, text, "?ód? ?? Ünal AB")
	require.Contains(t, text, "Credit note MG-CN-2026-000004")
	require.Contains(t, text, "MG-2026-000123")
	require.Contains(t, text, "Wrong address ? reissued")
}

func TestPDFLongTableContinues(t *testing.T) {
	t.Parallel()
	d := fixture()
	lines := d.Lines
	for range 15 {
		d.Lines = append(d.Lines, lines...)
	}
	d.SubtotalMinor *= 16
	d.TaxMinor = d.SubtotalMinor * 19 / 100
	d.TotalMinor = d.SubtotalMinor + d.TaxMinor
	checkTotals(t, d)
	pages := pdfText(t, renderPDF(t, d))
	require.GreaterOrEqual(t, len(pages), 3)
	rows := 0
	for i, page := range pages {
		require.Regexp(t, `Description\s+Quantity\s+Unit price\s+Amount`, page, "page %d repeats the table header", i+1)
		require.Contains(t, page, "Page "+FormatQuantity(int64(i+1))+" of "+FormatQuantity(int64(len(pages))))
		rows += strings.Count(page, "Base fee")
	}
	require.Equal(t, 16, rows, "every row on some page")
	require.Contains(t, pages[len(pages)-1], FormatMinor(d.TotalMinor, d.Currency))
}
