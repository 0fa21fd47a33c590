package document

import (
	"fmt"
	"io"
	"strings"
	"time"

	"codeberg.org/go-pdf/fpdf"
)

// The page, in millimetres: A4 with 15 mm margins and room at the bottom for the footer.
const (
	margin       = 15.0
	contentWidth = 210 - 2*margin
	bottom       = 297 - 20.0 // a row that would end below this starts a new page
	lineHeight   = 4.6
	rowPadding   = 1.2
)

// columns of the lines table: width and alignment.
var columns = []struct {
	title string
	width float64
	align string
}{
	{"Description", 80, "L"},
	{"Quantity", 26, "R"},
	{"Unit price", 42, "R"},
	{"Amount", 32, "R"},
}

// PDF writes d as an A4 PDF with the same content as HTML. The output is byte-stable: the
// same Document gives the same bytes, because the PDF's dates are d.IssuedAt (the Unix
// epoch when it is zero), the fonts are the core fonts (nothing embedded) and the
// catalog is sorted. Text is set in Windows-1252, which has € and the accented letters
// of western names; a character it lacks is printed as "?".
func PDF(w io.Writer, d Document) error {
	p := newPDF(d)
	v := newView(d)
	p.heading(v)
	p.parties(v)
	p.reason(v.Reason)
	p.lines(v.Rows)
	p.totals(v)
	if err := p.f.Output(w); err != nil {
		return fmt.Errorf("render %s as PDF: %w", d.Title(), err)
	}
	return nil
}

// pdf is a document being laid out: the fpdf page and the text encoder of its font.
type pdf struct {
	f    *fpdf.Fpdf
	text func(string) string // UTF-8 to what the core fonts print
}

func newPDF(d Document) *pdf {
	f := fpdf.New("P", "mm", "A4", "")
	stamp := d.IssuedAt.UTC()
	if d.IssuedAt.IsZero() {
		stamp = time.Unix(0, 0).UTC() // fpdf would write the time of the render
	}
	f.SetCreationDate(stamp)
	f.SetModificationDate(stamp)
	f.SetCatalogSort(true)
	f.SetTitle(d.Title(), true)
	f.SetAuthor(d.Seller.LegalName, true)
	f.SetMargins(margin, margin, margin)
	f.SetAutoPageBreak(true, 297-bottom)
	p := &pdf{f: f, text: cp1252(f)}
	title := p.text(d.Title())
	f.AliasNbPages("")
	f.SetHeaderFunc(func() {
		if f.PageNo() > 1 {
			p.font("", 8, 110)
			f.CellFormat(contentWidth, lineHeight, title+" (continued)", "", 1, "L", false, 0, "")
			f.Ln(2)
		}
	})
	f.SetFooterFunc(func() {
		f.SetY(-14)
		p.font("", 8, 110)
		f.CellFormat(contentWidth/2, lineHeight, title, "", 0, "L", false, 0, "")
		f.CellFormat(contentWidth/2, lineHeight, fmt.Sprintf("Page %d of {nb}", f.PageNo()), "", 0, "R", false, 0, "")
	})
	f.AddPage()
	return p
}

// cp1252 is the encoder of the core fonts: fpdf's Windows-1252 translation, with "?" for
// a character the code page lacks (fpdf would print "."), and a space for a control
// character.
func cp1252(f *fpdf.Fpdf) func(string) string {
	translate := f.UnicodeTranslatorFromDescriptor("cp1252")
	return func(s string) string {
		var b strings.Builder
		for _, r := range s {
			switch {
			case r < 0x20 || r == 0x7f:
				b.WriteByte(' ')
			case r < 0x80:
				b.WriteRune(r)
			default:
				t := translate(string(r))
				if t == "." {
					t = "?"
				}
				b.WriteString(t)
			}
		}
		return b.String()
	}
}

// font sets Helvetica in style ("", "B") at size points, in gray (0 black, 255 white).
func (p *pdf) font(style string, size float64, gray int) {
	p.f.SetFont("Helvetica", style, size)
	p.f.SetTextColor(gray, gray, gray)
}

// heading is the title, with the status stamped beside it when it is not "issued".
func (p *pdf) heading(v view) {
	f := p.f
	p.font("B", 18, 0)
	f.CellFormat(contentWidth-50, 10, p.text(v.Title), "", 0, "L", false, 0, "")
	if v.Stamp != "" {
		f.SetDrawColor(176, 0, 32)
		f.SetLineWidth(0.8)
		f.SetTextColor(176, 0, 32)
		f.CellFormat(50, 10, p.text(v.Stamp), "1", 0, "C", false, 0, "")
		f.SetLineWidth(0.2)
		f.SetDrawColor(0, 0, 0)
	}
	f.Ln(16)
}

// parties sets the seller, the buyer and the document's facts side by side.
func (p *pdf) parties(v view) {
	const width = contentWidth / 3
	top := p.f.GetY()
	end := max(
		p.block(margin, top, width, "FROM", v.Seller),
		p.block(margin+width, top, width, "BILL TO", v.Buyer),
		p.facts(margin+2*width, top, width, append(v.Facts, v.Refs...)),
	)
	p.f.SetY(end + 6)
}

// block sets a caption and lines of text in a column at (x, y) and returns where it ends.
func (p *pdf) block(x, y, w float64, caption string, lines []string) float64 {
	f := p.f
	p.font("B", 7.5, 110)
	f.SetXY(x, y)
	f.CellFormat(w, lineHeight, caption, "", 2, "L", false, 0, "")
	p.font("", 9, 0)
	for _, l := range lines {
		for _, part := range f.SplitLines([]byte(p.text(l)), w-2) {
			f.SetX(x)
			f.CellFormat(w, lineHeight, string(part), "", 2, "L", false, 0, "")
		}
	}
	return f.GetY()
}

// facts sets labelled values in a column at (x, y) and returns where it ends.
func (p *pdf) facts(x, y, w float64, facts []fact) float64 {
	f := p.f
	p.font("B", 7.5, 110)
	f.SetXY(x, y)
	f.CellFormat(w, lineHeight, "DOCUMENT", "", 2, "L", false, 0, "")
	const labelWidth = 24
	for _, fc := range facts {
		f.SetX(x)
		p.font("", 9, 110)
		f.CellFormat(labelWidth, lineHeight, p.text(fc.Label), "", 0, "L", false, 0, "")
		p.font("", 9, 0)
		f.CellFormat(w-labelWidth, lineHeight, p.text(fc.Value), "", 2, "L", false, 0, "")
	}
	return f.GetY()
}

// reason sets why the document was issued, when it says.
func (p *pdf) reason(reason string) {
	if reason == "" {
		return
	}
	p.font("B", 9, 0)
	p.f.CellFormat(16, lineHeight, "Reason:", "", 0, "L", false, 0, "")
	p.font("", 9, 0)
	p.f.MultiCell(contentWidth-16, lineHeight, p.text(reason), "", "L", false)
	p.f.Ln(4)
}

// lines sets the lines table; a row that does not fit continues the table on a new page
// under its header repeated.
func (p *pdf) lines(rows []Row) {
	p.tableHeader()
	for _, r := range rows {
		cells := p.cells(r)
		height := 0
		for _, c := range cells {
			height = max(height, len(c))
		}
		h := float64(height)*lineHeight + 2*rowPadding
		if p.f.GetY()+h > bottom {
			p.f.AddPage()
			p.tableHeader()
		}
		p.row(r, cells, h)
	}
}

func (p *pdf) tableHeader() {
	f := p.f
	p.font("B", 8, 70)
	f.SetFillColor(238, 238, 238)
	for _, c := range columns {
		f.CellFormat(c.width, lineHeight+2, c.title, "B", 0, c.align, true, 0, "")
	}
	f.Ln(-1)
}

// cells are a row's columns, each wrapped to lines that fit its width (a breakdown row's
// description is indented).
func (p *pdf) cells(r Row) [][][]byte {
	p.font("", 9, 0)
	texts := []string{r.Description, r.Quantity, r.UnitPrice, r.Amount}
	out := make([][][]byte, len(texts))
	for i, t := range texts {
		w := columns[i].width - 2
		if i == 0 && r.Breakdown {
			w -= indent
		}
		out[i] = p.f.SplitLines([]byte(p.text(t)), w)
	}
	return out
}

// indent sets a breakdown row's description in from the left.
const indent = 4

func (p *pdf) row(r Row, cells [][][]byte, h float64) {
	f := p.f
	top := f.GetY()
	gray := 0
	if r.Breakdown {
		gray = 120
	}
	x := margin
	for i, lines := range cells {
		c := columns[i]
		cx, cw := x, c.width
		if i == 0 && r.Breakdown {
			cx, cw = x+indent, c.width-indent
		}
		p.font("", 9, gray)
		for n, l := range lines {
			f.SetXY(cx, top+rowPadding+float64(n)*lineHeight)
			f.CellFormat(cw, lineHeight, string(l), "", 0, c.align, false, 0, "")
		}
		x += c.width
	}
	f.SetDrawColor(210, 210, 210)
	f.Line(margin, top+h, margin+contentWidth, top+h)
	f.SetDrawColor(0, 0, 0)
	f.SetXY(margin, top+h)
}

// totals sets subtotal, tax and total under the table's amount column.
func (p *pdf) totals(v view) {
	f := p.f
	const rows = 3
	if f.GetY()+2+rows*(lineHeight+1.5) > bottom {
		f.AddPage()
	}
	f.Ln(2)
	label := contentWidth - columns[len(columns)-1].width
	amount := columns[len(columns)-1].width
	for _, t := range []struct {
		label, value string
		style        string
	}{
		{"Subtotal", v.Subtotal, ""},
		{v.TaxLabel, v.Tax, ""},
		{"Total", v.Total, "B"},
	} {
		p.font(t.style, 9.5, 0)
		border := ""
		if t.style == "B" {
			border = "T"
		}
		f.CellFormat(label, lineHeight+1.5, p.text(t.label), "", 0, "R", false, 0, "")
		f.CellFormat(amount, lineHeight+1.5, p.text(t.value), border, 1, "R", false, 0, "")
	}
}
