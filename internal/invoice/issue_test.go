package invoice

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestUsageAndCorrectionLines prices an invoice from loaded data alone: no database.
func TestUsageAndCorrectionLines(t *testing.T) {
	t.Parallel()
	jan := time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)
	plan := Plan{ID: "pro", Version: 1, Currency: "EUR", BaseFeeMinor: 500, Units: []UnitPrice{
		{Unit: "requests", Included: 100, Tiers: []Tier{{From: 100, PriceMinor: 10, PerUnits: 1}}},
	}}
	usd := plan
	usd.Version, usd.Currency = 2, "USD"
	pr := prices{
		plans:    map[string]Plan{"pro": plan},
		versions: map[priceKey]Plan{{"pro", 1}: plan, {"pro", 2}: usd},
		invalid:  map[priceKey]error{},
		smallest: "pro",
	}
	usage := []Usage{
		{AccountPath: "acme/b", Unit: "requests", Quantity: 50},
		{AccountPath: "acme/a", Unit: "requests", Quantity: 150},
		{AccountPath: "acme/a", Unit: "tokens", Quantity: 7}, // not billed by the plan
	}
	covered := map[string]int64{"requests": 20}
	// January billed 120 requests for 200 (20 past the 100 included, at 10); 100 bill now (a
	// 5xx refunded 20).
	refund := correction{org: "acme", plan: "pro", version: 1, unit: "requests", period: jan, billed: 120, billable: 100, billedAmount: 200}
	// January's 130 requests were billed for 150 when a void took a 15-request late line
	// priced at 150 out: 115 units are left, billed for 150, though price(115) is 150 and
	// 130 bill now: the margin is priced from the amount billed, not from price(115).
	broken := correction{org: "acme", plan: "pro", version: 1, unit: "requests", period: jan, billed: 115, billable: 130, billedAmount: 0}

	tests := []struct {
		name        string
		corrections []correction
		wantLines   []Line
		wantBilled  map[[2]string]billedUnits
		wantErr     string
	}{
		{
			name: "usage only",
			wantLines: []Line{
				{Kind: KindBaseFee, AccountPath: "acme", Quantity: 1, UnitPriceMinor: 500, PerUnits: 1, AmountMinor: 500},
				{Kind: KindUsage, AccountPath: "acme/a", Unit: "requests", Quantity: 150, PerUnits: 1},
				{Kind: KindUsage, AccountPath: "acme/b", Unit: "requests", Quantity: 50, PerUnits: 1},
				{Kind: KindCreditsApplied, AccountPath: "acme", Unit: "requests", Quantity: 20, PerUnits: 1},
				{Kind: KindIncluded, AccountPath: "acme", Unit: "requests", Quantity: 100, PerUnits: 1},
				{Kind: KindOverageTier, AccountPath: "acme", Unit: "requests", Quantity: 80, UnitPriceMinor: 10, PerUnits: 1, AmountMinor: 800},
			},
			wantBilled: map[[2]string]billedUnits{},
		},
		{
			name:        "a correction follows, at its period's margin",
			corrections: []correction{refund},
			wantLines: []Line{
				{Kind: KindBaseFee, AccountPath: "acme", Quantity: 1, UnitPriceMinor: 500, PerUnits: 1, AmountMinor: 500},
				{Kind: KindUsage, AccountPath: "acme/a", Unit: "requests", Quantity: 150, PerUnits: 1},
				{Kind: KindUsage, AccountPath: "acme/b", Unit: "requests", Quantity: 50, PerUnits: 1},
				{Kind: KindCreditsApplied, AccountPath: "acme", Unit: "requests", Quantity: 20, PerUnits: 1},
				{Kind: KindIncluded, AccountPath: "acme", Unit: "requests", Quantity: 100, PerUnits: 1},
				{Kind: KindOverageTier, AccountPath: "acme", Unit: "requests", Quantity: 80, UnitPriceMinor: 10, PerUnits: 1, AmountMinor: 800},
				{Kind: KindAdjustment, AccountPath: "acme", Unit: "requests", Quantity: -20, PerUnits: 1, AmountMinor: -200, ForPeriod: "2025-01-01"},
			},
			wantBilled: map[[2]string]billedUnits{{"2025-01-01", "requests"}: {quantity: 100}},
		},
		{
			name:        "a correction after a void is priced from the amount billed",
			corrections: []correction{broken},
			wantLines: []Line{
				{Kind: KindBaseFee, AccountPath: "acme", Quantity: 1, UnitPriceMinor: 500, PerUnits: 1, AmountMinor: 500},
				{Kind: KindUsage, AccountPath: "acme/a", Unit: "requests", Quantity: 150, PerUnits: 1},
				{Kind: KindUsage, AccountPath: "acme/b", Unit: "requests", Quantity: 50, PerUnits: 1},
				{Kind: KindCreditsApplied, AccountPath: "acme", Unit: "requests", Quantity: 20, PerUnits: 1},
				{Kind: KindIncluded, AccountPath: "acme", Unit: "requests", Quantity: 100, PerUnits: 1},
				{Kind: KindOverageTier, AccountPath: "acme", Unit: "requests", Quantity: 80, UnitPriceMinor: 10, PerUnits: 1, AmountMinor: 800},
				{Kind: KindAdjustment, AccountPath: "acme", Unit: "requests", Quantity: 15, PerUnits: 1, AmountMinor: 300, ForPeriod: "2025-01-01"},
			},
			wantBilled: map[[2]string]billedUnits{{"2025-01-01", "requests"}: {quantity: 130, amount: 300}},
		},
		{
			name:        "a correction priced in another currency fails the org",
			corrections: []correction{func() correction { c := refund; c.version = 2; return c }()},
			wantErr:     "price correction of org acme: units of 2025-01 were priced in USD, the invoice is in EUR",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lines, billed, err := priceUsage(pr, plan, "acme", usage, covered, tt.corrections)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantLines, lines)
			require.Equal(t, tt.wantBilled, billed)
		})
	}
}
