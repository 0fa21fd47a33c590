package invoice_test

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
)

// fixture is testdata/pro_overage.json: a plan, usage per account path, and the lines and
// total computed by hand.
type fixture struct {
	Plan  invoice.Plan `json:"plan"`
	Org   string       `json:"org"`
	Usage []struct {
		Path     []string `json:"path"`
		Requests int64    `json:"requests"`
		Tokens   int64    `json:"tokens"`
	} `json:"usage"`
	Lines      []invoice.Line `json:"lines"`
	TotalMinor int64          `json:"total_minor"`
}

func loadFixture(t *testing.T) fixture {
	t.Helper()
	b, err := os.ReadFile("testdata/pro_overage.json")
	require.NoError(t, err)
	var f fixture
	require.NoError(t, json.Unmarshal(b, &f))
	return f
}

func (f fixture) usage() []invoice.Usage {
	var out []invoice.Usage
	for _, u := range f.Usage {
		p := strings.Join(u.Path, "/")
		out = append(out, invoice.Usage{AccountPath: p, Unit: "requests", Quantity: u.Requests},
			invoice.Usage{AccountPath: p, Unit: "tokens", Quantity: u.Tokens})
	}
	return out
}

func TestProOverageMatchesHandComputedFixture(t *testing.T) {
	t.Parallel()
	f := loadFixture(t)
	lines, err := invoice.Price(f.Plan, f.Org, f.usage(), nil)
	require.NoError(t, err)
	require.Equal(t, f.Lines, lines)
	total, err := invoice.Sum(lines)
	require.NoError(t, err)
	require.Equal(t, f.TotalMinor, total)
}

func TestTierAmountRoundsUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                  string
		units, price, per     int64
		want                  int64
		wantErr, wantOverflow bool
	}{
		{name: "exact", units: 15_000_000, price: 50, per: 100_000, want: 7_500},
		{name: "a fraction rounds up", units: 1_345_679, price: 30, per: 100_000, want: 404},
		{name: "the smallest fraction rounds up", units: 1, price: 1, per: 1_000, want: 1},
		{name: "just below a whole unit", units: 999, price: 1, per: 1_000, want: 1},
		{name: "a whole unit", units: 1_000, price: 1, per: 1_000, want: 1},
		{name: "just above a whole unit", units: 1_001, price: 1, per: 1_000, want: 2},
		{name: "zero units", units: 0, price: 50, per: 100_000, want: 0},
		{name: "free tier", units: 12_345, price: 0, per: 1, want: 0},
		{name: "a product beyond int64 fits after division", units: math.MaxInt64, price: 2, per: 4, want: math.MaxInt64/2 + 1},
		{name: "overflow", units: math.MaxInt64, price: 2, per: 1, wantOverflow: true},
		{name: "negative units", units: -1, price: 1, per: 1, wantErr: true},
		{name: "zero per", units: 1, price: 1, per: 0, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := invoice.TierAmount(tc.units, tc.price, tc.per)
			switch {
			case tc.wantOverflow:
				require.ErrorIs(t, err, invoice.ErrOverflow)
			case tc.wantErr:
				require.Error(t, err)
			default:
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
			}
		})
	}
}

func TestUnitPriceLines(t *testing.T) {
	t.Parallel()
	pro := loadFixture(t).Plan.Units[0] // requests: 5M included, 50/100k to 20M, then 30/100k
	free := invoice.UnitPrice{Unit: "requests", Included: 50_000}
	type want struct {
		kind            string
		quantity, price int64
		amount          int64
	}
	for _, tc := range []struct {
		name     string
		unit     invoice.UnitPrice
		quantity int64
		want     []want
	}{
		{name: "nothing used", unit: pro, quantity: 0, want: []want{{invoice.KindIncluded, 0, 0, 0}}},
		{name: "within included", unit: pro, quantity: 4_999_999, want: []want{{invoice.KindIncluded, 4_999_999, 0, 0}}},
		{name: "exactly included", unit: pro, quantity: 5_000_000, want: []want{{invoice.KindIncluded, 5_000_000, 0, 0}}},
		{name: "one unit over", unit: pro, quantity: 5_000_001, want: []want{
			{invoice.KindIncluded, 5_000_000, 0, 0}, {invoice.KindOverageTier, 1, 50, 1}}},
		{name: "first tier full", unit: pro, quantity: 20_000_000, want: []want{
			{invoice.KindIncluded, 5_000_000, 0, 0}, {invoice.KindOverageTier, 15_000_000, 50, 7_500}}},
		{name: "into the last tier", unit: pro, quantity: 20_000_001, want: []want{
			{invoice.KindIncluded, 5_000_000, 0, 0}, {invoice.KindOverageTier, 15_000_000, 50, 7_500}, {invoice.KindOverageTier, 1, 30, 1}}},
		{name: "no tiers: the excess is listed at price 0", unit: free, quantity: 50_010, want: []want{
			{invoice.KindIncluded, 50_000, 0, 0}, {invoice.KindOverageTier, 10, 0, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lines, err := tc.unit.Lines("acme", tc.quantity)
			require.NoError(t, err)
			got := make([]want, len(lines))
			var qty int64
			for i, l := range lines {
				got[i] = want{l.Kind, l.Quantity, l.UnitPriceMinor, l.AmountMinor}
				qty += l.Quantity
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.quantity, qty, "the lines' quantities add up to the quantity")
		})
	}
}

func TestUnitPriceValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		unit invoice.UnitPrice
	}{
		{name: "gap after included", unit: invoice.UnitPrice{Unit: "tokens", Included: 10, Tiers: []invoice.Tier{{From: 11, PriceMinor: 1, PerUnits: 1}}}},
		{name: "gap between tiers", unit: invoice.UnitPrice{Unit: "tokens", Tiers: []invoice.Tier{{From: 0, UpTo: 5, PriceMinor: 1, PerUnits: 1}, {From: 6, PriceMinor: 1, PerUnits: 1}}}},
		{name: "last tier ends", unit: invoice.UnitPrice{Unit: "tokens", Tiers: []invoice.Tier{{From: 0, UpTo: 5, PriceMinor: 1, PerUnits: 1}}}},
		{name: "endless tier not last", unit: invoice.UnitPrice{Unit: "tokens", Tiers: []invoice.Tier{{From: 0, PriceMinor: 1, PerUnits: 1}, {From: 0, PriceMinor: 1, PerUnits: 1}}}},
		{name: "zero per_units", unit: invoice.UnitPrice{Unit: "tokens", Tiers: []invoice.Tier{{From: 0, PriceMinor: 1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Error(t, tc.unit.Validate())
			_, err := tc.unit.Lines("acme", 100)
			require.Error(t, err)
		})
	}
}

// The month a close job closes: the last whose end plus the grace has passed.
func TestLastClosable(t *testing.T) {
	t.Parallel()
	nov, dec := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	oct := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	require.Equal(t, oct, invoice.LastClosable(dec.Add(invoice.DefaultGrace-time.Second), 0), "November's grace runs")
	require.Equal(t, nov, invoice.LastClosable(dec.Add(invoice.DefaultGrace), 0))
	require.Equal(t, nov, invoice.LastClosable(dec.Add(time.Hour), time.Hour))
	require.Equal(t, oct, invoice.LastClosable(dec.Add(time.Hour-1), time.Hour))
}
