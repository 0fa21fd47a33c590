package document

import (
	"strings"
	"time"

	"github.com/metergate/metergate/internal/period"
)

// Title is how a document is headed: "Invoice MG-2026-000123", "Credit note
// MG-CN-2026-000004", or just "Invoice" for one issued before numbering.
func (d Document) Title() string {
	t := "Invoice"
	if d.Kind == KindCreditNote {
		t = "Credit note"
	}
	if d.Number == "" {
		return t
	}
	return t + " " + d.Number
}

// fact is one labelled value of a document's header (number, dates, period...).
type fact struct {
	Label, Value string
}

// view is what the HTML and the PDF show of a document, in the order they show it, every
// text already formatted: the two renderings lay it out and add nothing.
type view struct {
	Title string
	// Stamp is the status shown prominently ("VOID", "PAID", "UNCOLLECTIBLE"); empty for
	// an issued document.
	Stamp    string
	Seller   []string
	Buyer    []string
	Facts    []fact
	Refs     []fact
	Reason   string
	Rows     []Row
	Subtotal string
	TaxLabel string // "Tax 19.00 %"
	Tax      string
	Total    string
}

func newView(d Document) view {
	v := view{
		Title:    d.Title(),
		Seller:   partyLines(d.Seller),
		Buyer:    []string{d.Org},
		Reason:   d.Reason,
		Subtotal: FormatMinor(d.SubtotalMinor, d.Currency),
		TaxLabel: "Tax " + FormatRate(d.TaxRateBP),
		Tax:      FormatMinor(d.TaxMinor, d.Currency),
		Total:    FormatMinor(d.TotalMinor, d.Currency),
	}
	if d.Buyer != nil {
		v.Buyer = partyLines(*d.Buyer)
	}
	if d.Status != "" && d.Status != "issued" {
		v.Stamp = strings.ToUpper(d.Status)
	}
	add := func(label, value string) {
		if value != "" {
			v.Facts = append(v.Facts, fact{label, value})
		}
	}
	add("Number", d.Number)
	add("Issued", day(d.IssuedAt))
	add("Due", day(d.DueAt))
	add("Period", d.Period)
	add("Account", d.Org)
	add("Currency", d.Currency)
	add("Status", d.Status)
	for _, r := range d.Refs {
		v.Refs = append(v.Refs, fact{r.Label, r.Number})
	}
	for _, l := range d.Lines {
		v.Rows = append(v.Rows, Describe(l, d.Currency))
	}
	return v
}

// partyLines is a party's address block, one line each: name, street lines, postal code
// and city, region, country, email, tax id.
func partyLines(p Party) []string {
	lines := []string{p.LegalName}
	lines = append(lines, p.Address...)
	lines = append(lines, strings.TrimSpace(p.PostalCode+" "+p.City), p.Region, p.Country, p.Email)
	if p.TaxID != "" {
		lines = append(lines, "Tax ID "+p.TaxID)
	}
	out := lines[:0]
	for _, l := range lines {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// day is t's UTC date, or "" for the zero time.
func day(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return period.DayLabel(t)
}
