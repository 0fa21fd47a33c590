// Package invoice closes billing periods and issues invoices from the billing log: prices
// live in the plans as versions (plan_prices, plan_price_units, plan_price_tiers; see
// AddPriceVersion), money is integer minor units, and issued invoices keep the price
// version they were priced with.
//
// Invoices are documents (docs/finance.md "Documents"): numbered without gaps per issuer
// (numbers.go), addressed from the customers' billing details and taxed (details.go,
// issuer.go), sealed by triggers but for their status, which changes with an audit row
// (status.go: a void issues a credit note), reissued from the log as it is (reissue.go),
// and corrected after their close by amendments (amend.go). Each document and status
// change records a billing event that webhooks deliver. Their renderings are
// internal/document's.
package invoice

import (
	"errors"
	"fmt"
	"math/big"
	"sort"
	"time"

	"github.com/metergate/metergate/internal/document"
)

// Line kinds, as stored in invoice_lines.kind.
const (
	KindBaseFee     = "base_fee"
	KindUsage       = "usage"
	KindIncluded    = "included"
	KindOverageTier = "overage_tier"
	KindAdjustment  = "adjustment"
	KindLate        = "late"
	// KindCreditsApplied is the units of a unit that the org's own prepaid credit grants
	// covered (amount 0: the credits were paid when bought); the tiers price the rest.
	KindCreditsApplied = "credits_applied"
)

// ErrOverflow is returned when an amount does not fit in an int64 of minor units.
var ErrOverflow = errors.New("amount overflows int64 minor units")

// Tier is one graduated tier: units of the period in [From, UpTo) cost PriceMinor per
// PerUnits. UpTo 0 means no end (NULL in plan_price_tiers).
type Tier struct {
	From       int64 `json:"from_units"`
	UpTo       int64 `json:"up_to_units,omitempty"`
	PriceMinor int64 `json:"price_minor"`
	PerUnits   int64 `json:"per_units"`
}

// UnitPrice is how a plan bills one unit: Included units are covered by the base fee, the
// rest is priced by Tiers, which run contiguously from Included to no end.
type UnitPrice struct {
	Unit     string `json:"unit"`
	Included int64  `json:"included_units"`
	Tiers    []Tier `json:"tiers"`
}

// Plan is one version of a plan's price: currency, base fee and the units it bills, from
// EffectivePeriod on (until a later version takes over; see PriceVersions).
type Plan struct {
	ID      string `json:"plan"`
	Version int    `json:"version"`
	// EffectivePeriod is the first day of the first month the version prices; zero means
	// from the start (a plan's first version).
	EffectivePeriod time.Time   `json:"effective_period"`
	Currency        string      `json:"currency"`
	BaseFeeMinor    int64       `json:"base_fee_minor"`
	Units           []UnitPrice `json:"units"`
	CreatedAt       time.Time   `json:"created_at"`
}

// Line is one invoice line (document.Line: the same line is rendered). Amounts are minor
// units of the invoice's currency.
type Line = document.Line

// TierAmount is the rounding rule: ceil(units × priceMinor / perUnits), computed exactly.
func TierAmount(units, priceMinor, perUnits int64) (int64, error) {
	if units < 0 || priceMinor < 0 || perUnits <= 0 {
		return 0, fmt.Errorf("tier amount of %d units at %d per %d: negative or zero input", units, priceMinor, perUnits)
	}
	n := new(big.Int).Mul(big.NewInt(units), big.NewInt(priceMinor))
	n.Add(n, big.NewInt(perUnits-1))
	n.Quo(n, big.NewInt(perUnits))
	if !n.IsInt64() {
		return 0, ErrOverflow
	}
	return n.Int64(), nil
}

// Validate checks that the tiers are contiguous from Included to no end (or absent).
func (u UnitPrice) Validate() error {
	if u.Included < 0 {
		return fmt.Errorf("unit %s: negative included units", u.Unit)
	}
	next := u.Included
	for i, t := range u.Tiers {
		switch {
		case t.From != next:
			return fmt.Errorf("unit %s: tier %d starts at %d, want %d", u.Unit, i, t.From, next)
		case t.UpTo != 0 && t.UpTo <= t.From:
			return fmt.Errorf("unit %s: tier %d ends at %d before it starts", u.Unit, i, t.UpTo)
		case t.UpTo == 0 && i != len(u.Tiers)-1:
			return fmt.Errorf("unit %s: tier %d has no end but is not the last", u.Unit, i)
		case t.UpTo != 0 && i == len(u.Tiers)-1:
			return fmt.Errorf("unit %s: the last tier ends at %d, want no end", u.Unit, t.UpTo)
		case t.PriceMinor < 0 || t.PerUnits <= 0:
			return fmt.Errorf("unit %s: tier %d: price %d per %d", u.Unit, i, t.PriceMinor, t.PerUnits)
		}
		next = t.UpTo
	}
	return nil
}

// Lines prices quantity units of the period: an included line (up to Included units, amount
// 0) and one overage_tier line per tier the quantity reaches. Units beyond Included of a
// unit without tiers get one overage_tier line at price 0, so that the lines' quantities
// always add up to quantity.
func (u UnitPrice) Lines(org string, quantity int64) ([]Line, error) {
	if err := u.Validate(); err != nil {
		return nil, err
	}
	if quantity < 0 {
		return nil, fmt.Errorf("unit %s: negative quantity %d", u.Unit, quantity)
	}
	lines := []Line{{Kind: KindIncluded, AccountPath: org, Unit: u.Unit, Quantity: min(quantity, u.Included), PerUnits: 1}}
	if quantity <= u.Included {
		return lines, nil
	}
	if len(u.Tiers) == 0 {
		return append(lines, Line{Kind: KindOverageTier, AccountPath: org, Unit: u.Unit, Quantity: quantity - u.Included, PerUnits: 1}), nil
	}
	for _, t := range u.Tiers {
		if quantity <= t.From {
			break
		}
		end := quantity
		if t.UpTo != 0 {
			end = min(end, t.UpTo)
		}
		amount, err := TierAmount(end-t.From, t.PriceMinor, t.PerUnits)
		if err != nil {
			return nil, fmt.Errorf("unit %s: %w", u.Unit, err)
		}
		lines = append(lines, Line{Kind: KindOverageTier, AccountPath: org, Unit: u.Unit, Quantity: end - t.From,
			UnitPriceMinor: t.PriceMinor, PerUnits: t.PerUnits, AmountMinor: amount})
	}
	return lines, nil
}

// Amount is the sum of what Lines charges for quantity units.
func (u UnitPrice) Amount(quantity int64) (int64, error) {
	lines, err := u.Lines("", quantity)
	if err != nil {
		return 0, err
	}
	return Sum(lines)
}

// Sum adds the lines' amounts, refusing an overflow.
func Sum(lines []Line) (int64, error) {
	var total int64
	for _, l := range lines {
		s := total + l.AmountMinor
		if (l.AmountMinor > 0 && s < total) || (l.AmountMinor < 0 && s > total) {
			return 0, ErrOverflow
		}
		total = s
	}
	return total, nil
}

// Usage is what one account path used of one unit in a period.
type Usage struct {
	AccountPath string
	Unit        string
	Quantity    int64
}

// Price builds an org's invoice lines for a period: the base fee, one usage line per
// account path and billed unit (amount 0: the breakdown), then per billed unit a
// credits_applied line when covered (unit → units the org's prepaid credits covered; nil:
// none) has units of it, and the included line and the overage tier lines of the org's
// total less the covered units (never below 0). Units the plan does not bill are left out.
// The order is deterministic: base fee, then units in the plan's order, usage lines by path.
func Price(plan Plan, org string, usage []Usage, covered map[string]int64) ([]Line, error) {
	lines := []Line{{Kind: KindBaseFee, AccountPath: org, Quantity: 1, UnitPriceMinor: plan.BaseFeeMinor, PerUnits: 1, AmountMinor: plan.BaseFeeMinor}}
	for _, up := range plan.Units {
		var rows []Usage
		var total int64
		for _, u := range usage {
			if u.Unit != up.Unit || u.Quantity == 0 {
				continue
			}
			rows = append(rows, u)
			total += u.Quantity
			if total < 0 {
				return nil, ErrOverflow
			}
		}
		sort.Slice(rows, func(i, j int) bool { return rows[i].AccountPath < rows[j].AccountPath })
		for _, r := range rows {
			lines = append(lines, Line{Kind: KindUsage, AccountPath: r.AccountPath, Unit: r.Unit, Quantity: r.Quantity, PerUnits: 1})
		}
		c := covered[up.Unit]
		if c < 0 {
			return nil, fmt.Errorf("unit %s: negative covered units %d", up.Unit, c)
		}
		if c = min(c, total); c > 0 {
			lines = append(lines, Line{Kind: KindCreditsApplied, AccountPath: org, Unit: up.Unit, Quantity: c, PerUnits: 1})
			total -= c
		}
		priced, err := up.Lines(org, total)
		if err != nil {
			return nil, fmt.Errorf("plan %s: %w", plan.ID, err)
		}
		lines = append(lines, priced...)
	}
	return lines, nil
}
