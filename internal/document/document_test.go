package document

import (
	"strings"
	"testing"
	"time"
)

// fixture is an invoice with a seller, a buyer whose name and address are not ASCII, two
// units with tiers, prepaid credits, a late line, a correction and 19 % tax. Its totals
// were computed by hand: lines 490.00 + 45.00 + 8.00 + 1,500.00 + 10.00 − 1.20 = 2,051.80,
// tax 389.842 → 389.84, total 2,441.64.
func fixture() Document {
	return Document{
		Kind:     KindInvoice,
		Number:   "MG-2026-000123",
		Status:   "issued",
		IssuedAt: time.Date(2026, 11, 1, 0, 5, 0, 0, time.UTC),
		DueAt:    time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		Period:   "2026-10",
		Org:      "acme",
		Seller: Party{
			LegalName: "Metergate Ltd", Address: []string{"1 Dock Road"}, City: "Dublin", PostalCode: "D01 X2Y3",
			Country: "IE", Email: "billing@metergate.example", TaxID: "IE1234567X",
		},
		Buyer: &Party{
			LegalName: "Müller & Søn GmbH", Address: []string{"Königstraße 12", "Büro €uro"}, City: "Stuttgart",
			PostalCode: "70173", Country: "DE", TaxID: "DE123456789",
		},
		Currency: "EUR",
		Lines: []Line{
			{Kind: "base_fee", AccountPath: "acme", Quantity: 1, UnitPriceMinor: 49000, PerUnits: 1, AmountMinor: 49000},
			{Kind: "usage", AccountPath: "acme/team-a", Unit: "requests", Quantity: 10_000_000, PerUnits: 1},
			{Kind: "usage", AccountPath: "acme/team-b", Unit: "requests", Quantity: 2_345_678, PerUnits: 1},
			{Kind: "credits_applied", AccountPath: "acme", Unit: "requests", Quantity: 345_678, PerUnits: 1},
			{Kind: "included", AccountPath: "acme", Unit: "requests", Quantity: 1_000_000, PerUnits: 1},
			{Kind: "overage_tier", AccountPath: "acme", Unit: "requests", Quantity: 9_000_000, UnitPriceMinor: 50, PerUnits: 100_000, AmountMinor: 4500},
			{Kind: "overage_tier", AccountPath: "acme", Unit: "requests", Quantity: 2_000_000, UnitPriceMinor: 40, PerUnits: 100_000, AmountMinor: 800},
			{Kind: "usage", AccountPath: "acme/team-a", Unit: "tokens", Quantity: 60_100_000, PerUnits: 1},
			{Kind: "included", AccountPath: "acme", Unit: "tokens", Quantity: 100_000, PerUnits: 1},
			{Kind: "overage_tier", AccountPath: "acme", Unit: "tokens", Quantity: 60_000_000, UnitPriceMinor: 2500, PerUnits: 1_000_000, AmountMinor: 150_000},
			{Kind: "late", AccountPath: "acme/team-a", Unit: "requests", Quantity: 2_500_000, PerUnits: 1, AmountMinor: 1000, ForPeriod: "2026-09-01"},
			{Kind: "adjustment", AccountPath: "acme", Unit: "requests", Quantity: -300_000, PerUnits: 1, AmountMinor: -120, ForPeriod: "2026-08-01"},
		},
		SubtotalMinor: 205_180,
		TaxRateBP:     1900,
		TaxMinor:      38_984,
		TotalMinor:    244_164,
	}
}

// handWritten are the fixture's totals as a person writes them, so that a broken
// formatter fails the renderings' tests too (their other expectations come from it).
var handWritten = []string{
	"EUR 490.00", "EUR 45.00", "EUR 1,500.00", "EUR -1.20", "10,000,000",
	"EUR 2,051.80", "Tax 19.00 %", "EUR 389.84", "EUR 2,441.64",
}

// expected is every text a rendering of d must show: title, buyer, each charged line's
// amount, subtotal, tax and total, formatted as FormatMinor gives them.
func expected(d Document) []string {
	want := []string{d.Title(), "Tax " + FormatRate(d.TaxRateBP),
		FormatMinor(d.SubtotalMinor, d.Currency), FormatMinor(d.TaxMinor, d.Currency), FormatMinor(d.TotalMinor, d.Currency)}
	if d.Buyer != nil {
		want = append(want, d.Buyer.LegalName)
	}
	for _, l := range d.Lines {
		if r := Describe(l, d.Currency); !r.Breakdown {
			want = append(want, r.Amount)
		}
	}
	return append(want, handWritten...)
}

// checkTotals fails when d's totals do not follow from its lines (the fixture's own
// consistency: a rendering shows them, it does not compute them).
func checkTotals(t *testing.T, d Document) {
	t.Helper()
	var sum int64
	for _, l := range d.Lines {
		sum += l.AmountMinor
	}
	if sum != d.SubtotalMinor || d.SubtotalMinor+d.TaxMinor != d.TotalMinor {
		t.Fatalf("fixture totals: lines %d, subtotal %d + tax %d ≠ total %d", sum, d.SubtotalMinor, d.TaxMinor, d.TotalMinor)
	}
}

func TestFixture(t *testing.T) {
	t.Parallel()
	checkTotals(t, fixture())
	if got := strings.Join(expected(fixture()), "|"); !strings.Contains(got, "EUR 1,500.00") {
		t.Fatalf("expected texts miss the tokens tier: %s", got)
	}
}
