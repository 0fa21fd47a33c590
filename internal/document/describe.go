package document

import "github.com/metergate/metergate/internal/period"

// Line kinds, as internal/invoice writes them.
const (
	kindBaseFee        = "base_fee"
	kindUsage          = "usage"
	kindIncluded       = "included"
	kindOverageTier    = "overage_tier"
	kindLate           = "late"
	kindAdjustment     = "adjustment"
	kindCreditsApplied = "credits_applied"
)

// NoAmount is the amount column of a breakdown row: the line explains units, it charges
// nothing.
const NoAmount = "—"

// Row is a line as people read it: the text of its columns. HTML, PDF and CSV all take
// their descriptions and columns from Describe.
type Row struct {
	Description string
	Quantity    string // e.g. "1,250,000"
	UnitPrice   string // e.g. "EUR 0.50 / 100,000"; empty when the line has no unit price
	Amount      string // e.g. "EUR 45.00"; NoAmount for a breakdown row
	// Breakdown marks a line that explains where units went (usage by account path,
	// included units, units prepaid credits paid for) and charges nothing.
	Breakdown bool
}

// Describe gives line l of a document in currency its description and columns:
// base_fee "Base fee", usage "Usage: requests by acme/team-a", included "requests
// included", overage_tier "requests at EUR 0.50 per 100,000", late "Late requests of
// 2026-10 by acme/team-a", adjustment "Correction of requests for 2026-10",
// credits_applied "requests paid with prepaid credits".
func Describe(l Line, currency string) Row {
	r := Row{Quantity: FormatQuantity(l.Quantity), Amount: FormatMinor(l.AmountMinor, currency)}
	switch l.Kind {
	case kindBaseFee:
		r.Description = "Base fee"
		r.UnitPrice = unitPrice(l, currency)
	case kindUsage:
		r.Description = "Usage: " + l.Unit + " by " + l.AccountPath
	case kindIncluded:
		r.Description = l.Unit + " included"
	case kindOverageTier:
		r.Description = l.Unit + " at " + FormatMinor(l.UnitPriceMinor, currency) + per(l.PerUnits)
		r.UnitPrice = unitPrice(l, currency)
	case kindLate:
		r.Description = "Late " + l.Unit + ofPeriod(l.ForPeriod) + " by " + l.AccountPath
	case kindAdjustment:
		r.Description = "Correction of " + l.Unit
		if l.ForPeriod != "" {
			r.Description += " for " + month(l.ForPeriod)
		}
	case kindCreditsApplied:
		r.Description = l.Unit + ofPeriod(l.ForPeriod) + " paid with prepaid credits"
	default:
		r.Description = l.Kind + " " + l.Unit
	}
	switch l.Kind {
	case kindUsage, kindIncluded, kindCreditsApplied:
		// Never hide money: a breakdown kind that charges something shows its amount.
		if l.AmountMinor == 0 {
			r.Breakdown, r.Amount = true, NoAmount
		}
	}
	return r
}

// unitPrice is the unit price column: "EUR 49.00", or "EUR 0.50 / 100,000" for a price
// per more than one unit.
func unitPrice(l Line, currency string) string {
	s := FormatMinor(l.UnitPriceMinor, currency)
	if l.PerUnits > 1 {
		s += " / " + FormatQuantity(l.PerUnits)
	}
	return s
}

// per is " each" or " per 100,000".
func per(units int64) string {
	if units > 1 {
		return " per " + FormatQuantity(units)
	}
	return " each"
}

// ofPeriod is " of 2026-10" for a line of a closed period, else "".
func ofPeriod(forPeriod string) string {
	if forPeriod == "" {
		return ""
	}
	return " of " + month(forPeriod)
}

// month is the month of a line's for_period (YYYY-MM-DD), or the label itself when it is
// not one.
func month(forPeriod string) string {
	t, err := period.Parse(forPeriod)
	if err != nil {
		return forPeriod
	}
	return period.MonthLabel(t)
}
