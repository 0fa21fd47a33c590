package invoice

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/period"
)

// The statements that add and read price versions.
var (
	//go:embed sql/last_version.sql
	lastVersionSQL string
	//go:embed sql/insert_price.sql
	insertPriceSQL string
	//go:embed sql/insert_tier.sql
	insertTierSQL string
	//go:embed sql/price_versions.sql
	priceVersionsSQL string
	//go:embed sql/plan_price_versions.sql
	planPriceVersionsSQL string
	//go:embed sql/price_units.sql
	priceUnitsSQL string
	//go:embed sql/plan_price_units.sql
	planPriceUnitsSQL string
)

// InvalidPriceError is a price version that cannot be stored. Field names the part at
// fault: currency, base_fee_minor, effective_period or units.
type InvalidPriceError struct {
	Field   string
	Message string
}

// Error returns "field: message".
func (e *InvalidPriceError) Error() string { return e.Field + ": " + e.Message }

func invalidPrice(field, format string, args ...any) *InvalidPriceError {
	return &InvalidPriceError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// currencyShape is the shape of an ISO 4217 code, as the plan_prices constraint checks it.
var currencyShape = regexp.MustCompile(`^[A-Z]{3}$`)

// Validate checks a price version before it is stored: an ISO 4217-shaped currency, a base
// fee of zero or more minor units, an effective period on the first of a month (or zero),
// and units the billing log knows, each at most once, with tiers contiguous from the
// included units to no end (UnitPrice.Validate).
func (p Plan) Validate() error {
	if !currencyShape.MatchString(p.Currency) {
		return invalidPrice("currency", "%q is not an ISO 4217 code (three capital letters, e.g. EUR)", p.Currency)
	}
	if p.BaseFeeMinor < 0 {
		return invalidPrice("base_fee_minor", "must be 0 or more minor units, got %d", p.BaseFeeMinor)
	}
	if !p.EffectivePeriod.IsZero() && !p.EffectivePeriod.Equal(period.MonthStart(p.EffectivePeriod)) {
		return invalidPrice("effective_period", "must be the first instant of a month (UTC)")
	}
	seen := map[string]bool{}
	for _, up := range p.Units {
		known := false
		for _, u := range units {
			known = known || u == up.Unit
		}
		if !known {
			return invalidPrice("units", "unknown unit %q (want requests, tokens, credits or cost_micros)", up.Unit)
		}
		if seen[up.Unit] {
			return invalidPrice("units", "unit %s is priced twice", up.Unit)
		}
		seen[up.Unit] = true
		if err := up.Validate(); err != nil {
			return invalidPrice("units", "%s", err.Error())
		}
	}
	return nil
}

// AddPriceVersion adds a version of the price of plan p.ID in tx and returns it as stored
// (Version and CreatedAt set, units in unit order). Versions are never changed: a new one is
// the way to change a price, and the invoices keep the version they were priced with.
//
// A plan's first version prices every period (p.EffectivePeriod must be zero). A later one
// needs an EffectivePeriod after the last closed period, so that no issued invoice's period
// changes price; it takes over from there, superseding versions effective later. periods
// is locked in share mode first, so a close running at the same time either commits before
// the check (and the period counts as closed) or waits for this transaction and prices the
// period with the new version. An *InvalidPriceError for a refused price.
func AddPriceVersion(ctx context.Context, tx pgx.Tx, p Plan) (Plan, error) {
	if err := p.Validate(); err != nil {
		return Plan{}, err
	}
	if _, err := tx.Exec(ctx, `lock table periods in share mode`); err != nil {
		return Plan{}, fmt.Errorf("lock periods: %w", err)
	}
	var (
		last       int
		lastClosed *time.Time
	)
	// FOR UPDATE on the plan: versions of one plan are numbered one at a time.
	err := tx.QueryRow(ctx, lastVersionSQL, pgx.StrictNamedArgs{"plan": p.ID}).Scan(&last, &lastClosed)
	if errors.Is(err, pgx.ErrNoRows) {
		return Plan{}, invalidPrice("plan", "plan %q does not exist", p.ID)
	}
	if err != nil {
		return Plan{}, fmt.Errorf("read price versions of %s: %w", p.ID, err)
	}
	switch {
	case last == 0 && !p.EffectivePeriod.IsZero():
		return Plan{}, invalidPrice("effective_period", "a plan's first price applies from the start: leave effective_period out")
	case last > 0 && p.EffectivePeriod.IsZero():
		return Plan{}, invalidPrice("effective_period", "a price change needs the month it takes effect (YYYY-MM)")
	case last > 0 && lastClosed != nil && !p.EffectivePeriod.After(*lastClosed):
		return Plan{}, invalidPrice("effective_period", "%s is closed (invoiced up to %s): a new price can take effect from %s",
			period.MonthLabel(p.EffectivePeriod), period.MonthLabel(*lastClosed), period.MonthLabel(lastClosed.AddDate(0, 1, 0)))
	}
	p.Version = last + 1
	if err := tx.QueryRow(ctx, insertPriceSQL, pgx.StrictNamedArgs{
		"plan": p.ID, "version": p.Version, "effective_period": p.EffectivePeriod,
		"currency": p.Currency, "base_fee_minor": p.BaseFeeMinor,
	}).Scan(&p.CreatedAt); err != nil {
		return Plan{}, fmt.Errorf("insert price version %d of %s: %w", p.Version, p.ID, err)
	}
	for _, up := range p.Units {
		if _, err := tx.Exec(ctx, `insert into plan_price_units (plan, version, unit, included_units) values ($1, $2, $3, $4)`,
			p.ID, p.Version, up.Unit, up.Included); err != nil {
			return Plan{}, fmt.Errorf("insert price of %s, version %d of %s: %w", up.Unit, p.Version, p.ID, err)
		}
		for _, t := range up.Tiers {
			var upTo *int64
			if t.UpTo != 0 {
				upTo = &t.UpTo
			}
			if _, err := tx.Exec(ctx, insertTierSQL, pgx.StrictNamedArgs{
				"plan": p.ID, "version": p.Version, "unit": up.Unit, "from_units": t.From,
				"up_to_units": upTo, "price_minor": t.PriceMinor, "per_units": t.PerUnits,
			}); err != nil {
				return Plan{}, fmt.Errorf("insert tier of %s, version %d of %s: %w", up.Unit, p.Version, p.ID, err)
			}
		}
	}
	versions, err := loadPrices(ctx, tx, p.ID)
	if err != nil {
		return Plan{}, err
	}
	return versions[len(versions)-1], nil
}

// PriceVersions returns every version of the price of plan (of every plan when plan is
// empty), by plan and version. The version that prices a period is the highest one whose
// EffectivePeriod is not after it (SQL: price_version(plan, period)); see VersionAt.
func PriceVersions(ctx context.Context, q querier, plan string) ([]Plan, error) {
	return loadPrices(ctx, q, plan)
}

// VersionAt returns the version of versions (of one plan, by version) that prices the
// period starting at month; ok is false when none does.
func VersionAt(versions []Plan, month time.Time) (Plan, bool) {
	var out Plan
	ok := false
	for _, v := range versions {
		if !v.EffectivePeriod.After(month) && v.Version > out.Version {
			out, ok = v, true
		}
	}
	return out, ok
}

// loadPrices reads the price versions of plan (all plans when empty), by plan and version;
// an error when one does not validate.
func loadPrices(ctx context.Context, q querier, plan string) ([]Plan, error) {
	out, invalid, err := readPrices(ctx, q, plan)
	if err != nil {
		return nil, err
	}
	for _, p := range out {
		if err := invalid[priceKey{p.ID, p.Version}]; err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readPrices reads the price versions of plan (all plans when empty), by plan and version,
// and the versions that do not validate (stored behind AddPriceVersion's back) with why.
func readPrices(ctx context.Context, q querier, plan string) ([]Plan, map[priceKey]error, error) {
	versionsSQL, unitsSQL, args := priceVersionsSQL, priceUnitsSQL, pgx.StrictNamedArgs{}
	if plan != "" {
		versionsSQL, unitsSQL, args = planPriceVersionsSQL, planPriceUnitsSQL, pgx.StrictNamedArgs{"plan": plan}
	}
	rows, err := q.Query(ctx, versionsSQL, args)
	if err != nil {
		return nil, nil, fmt.Errorf("read plan prices: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Plan, error) {
		var p Plan
		err := r.Scan(&p.ID, &p.Version, &p.EffectivePeriod, &p.Currency, &p.BaseFeeMinor, &p.CreatedAt)
		return p, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read plan prices: %w", err)
	}
	invalid := map[priceKey]error{}
	index := make(map[priceKey]int, len(out))
	for i, p := range out {
		index[priceKey{p.ID, p.Version}] = i
	}
	rows, err = q.Query(ctx, unitsSQL, args)
	if err != nil {
		return nil, nil, fmt.Errorf("read plan units: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k priceKey
		var up UnitPrice
		var from, upTo, price, per []int64
		if err := rows.Scan(&k.plan, &k.version, &up.Unit, &up.Included, &from, &upTo, &price, &per); err != nil {
			return nil, nil, fmt.Errorf("read plan units: %w", err)
		}
		for i := range from {
			up.Tiers = append(up.Tiers, Tier{From: from[i], UpTo: upTo[i], PriceMinor: price[i], PerUnits: per[i]})
		}
		if err := up.Validate(); err != nil && invalid[k] == nil {
			invalid[k] = fmt.Errorf("plan %s version %d: %w", k.plan, k.version, err)
		}
		if i, ok := index[k]; ok {
			out[i].Units = append(out[i].Units, up)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read plan units: %w", err)
	}
	return out, invalid, nil
}

// priceKey names one price version of a plan.
type priceKey struct {
	plan    string
	version int
}

// prices are the price versions a close prices with.
type prices struct {
	plans    map[string]Plan   // per plan, the version that prices the period
	versions map[priceKey]Plan // every version
	invalid  map[priceKey]error
	smallest string // the plan of an org with an unknown or missing plan
}

// plan is the version of plan id that prices the period, or why there is none to use.
func (p prices) plan(id string) (Plan, error) {
	v, ok := p.plans[id]
	if !ok {
		return Plan{}, fmt.Errorf("plan %s has no price for the period", id)
	}
	if err := p.invalid[priceKey{v.ID, v.Version}]; err != nil {
		return Plan{}, err
	}
	return v, nil
}

// version is price version k, or why it cannot be used.
func (p prices) version(k priceKey) (Plan, error) {
	v, ok := p.versions[k]
	if !ok {
		return Plan{}, fmt.Errorf("price version %d of plan %s is gone", k.version, k.plan)
	}
	if err := p.invalid[k]; err != nil {
		return Plan{}, err
	}
	return v, nil
}

// loadPlans reads every price version and, per plan, the version that prices period (plans
// without one are unpriced for the period), and the smallest plan (lowest rank), which an
// org with an unknown or missing plan is billed on, as admit clamps it. A version that does
// not validate is kept with its error: only the orgs priced with it fail.
func loadPlans(ctx context.Context, tx pgx.Tx, period time.Time) (prices, error) {
	all, invalid, err := readPrices(ctx, tx, "")
	if err != nil {
		return prices{}, err
	}
	pr := prices{plans: map[string]Plan{}, versions: make(map[priceKey]Plan, len(all)), invalid: invalid}
	for _, p := range all { // by plan and version: the last effective one wins
		pr.versions[priceKey{p.ID, p.Version}] = p
		if !p.EffectivePeriod.After(period) {
			pr.plans[p.ID] = p
		}
	}
	if err := tx.QueryRow(ctx, `select id from plans order by rank limit 1`).Scan(&pr.smallest); err != nil {
		return prices{}, fmt.Errorf("read the smallest plan: %w", err)
	}
	return pr, nil
}
