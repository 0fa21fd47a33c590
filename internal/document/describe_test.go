package document

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDescribe(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		line Line
		want Row
	}{
		{
			Line{Kind: "base_fee", AccountPath: "acme", Quantity: 1, UnitPriceMinor: 49000, PerUnits: 1, AmountMinor: 49000},
			Row{Description: "Base fee", Quantity: "1", UnitPrice: "EUR 490.00", Amount: "EUR 490.00"},
		},
		{
			Line{Kind: "usage", AccountPath: "acme/team-a", Unit: "requests", Quantity: 10_000_000, PerUnits: 1},
			Row{Description: "Usage: requests by acme/team-a", Quantity: "10,000,000", Amount: NoAmount, Breakdown: true},
		},
		{
			Line{Kind: "included", AccountPath: "acme", Unit: "requests", Quantity: 1_000_000, PerUnits: 1},
			Row{Description: "requests included", Quantity: "1,000,000", Amount: NoAmount, Breakdown: true},
		},
		{
			Line{Kind: "overage_tier", AccountPath: "acme", Unit: "requests", Quantity: 9_000_000, UnitPriceMinor: 50, PerUnits: 100_000, AmountMinor: 4500},
			Row{Description: "requests at EUR 0.50 per 100,000", Quantity: "9,000,000", UnitPrice: "EUR 0.50 / 100,000", Amount: "EUR 45.00"},
		},
		{
			Line{Kind: "overage_tier", AccountPath: "acme", Unit: "tokens", Quantity: 7, PerUnits: 1},
			Row{Description: "tokens at EUR 0.00 each", Quantity: "7", UnitPrice: "EUR 0.00", Amount: "EUR 0.00"},
		},
		{
			Line{Kind: "late", AccountPath: "acme/team-a", Unit: "requests", Quantity: 2_500_000, PerUnits: 1, AmountMinor: 1000, ForPeriod: "2026-10-01"},
			Row{Description: "Late requests of 2026-10 by acme/team-a", Quantity: "2,500,000", Amount: "EUR 10.00"},
		},
		{
			Line{Kind: "adjustment", AccountPath: "acme", Unit: "requests", Quantity: -300_000, PerUnits: 1, AmountMinor: -120, ForPeriod: "2026-10-01"},
			Row{Description: "Correction of requests for 2026-10", Quantity: "-300,000", Amount: "EUR -1.20"},
		},
		{
			Line{Kind: "credits_applied", AccountPath: "acme", Unit: "requests", Quantity: 345_678, PerUnits: 1},
			Row{Description: "requests paid with prepaid credits", Quantity: "345,678", Amount: NoAmount, Breakdown: true},
		},
		{
			Line{Kind: "credits_applied", AccountPath: "acme/team-a", Unit: "requests", Quantity: 5, PerUnits: 1, ForPeriod: "2026-09-01"},
			Row{Description: "requests of 2026-09 paid with prepaid credits", Quantity: "5", Amount: NoAmount, Breakdown: true},
		},
		{ // a breakdown kind that charges something shows it
			Line{Kind: "usage", AccountPath: "acme", Unit: "requests", Quantity: 5, PerUnits: 1, AmountMinor: 3},
			Row{Description: "Usage: requests by acme", Quantity: "5", Amount: "EUR 0.03"},
		},
		{
			Line{Kind: "discount", Unit: "requests", Quantity: 1, AmountMinor: -500},
			Row{Description: "discount requests", Quantity: "1", Amount: "EUR -5.00"},
		},
	} {
		require.Equal(t, tc.want, Describe(tc.line, "EUR"), "%+v", tc.line)
	}
}
