package invoice_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
)

// addPrice adds a version of plan's price.
func (b *testBundle) addPrice(t *testing.T, p invoice.Plan) (invoice.Plan, error) {
	t.Helper()
	var out invoice.Plan
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		out, err = invoice.AddPriceVersion(b.ctx, tx, p)
		return err
	})
	return out, err
}

// proV2 is pro with a dearer base fee and requests beyond the included ones at 100 per
// 100,000 (version 1: 50), effective from.
func proV2(from time.Time, baseFee int64) invoice.Plan {
	return invoice.Plan{ID: "pro", EffectivePeriod: from, Currency: "EUR", BaseFeeMinor: baseFee, Units: []invoice.UnitPrice{
		{Unit: "requests", Included: 5_000_000, Tiers: []invoice.Tier{{From: 5_000_000, PriceMinor: 100, PerUnits: 100_000}}},
		{Unit: "tokens", Included: 10_000_000},
	}}
}

func invoiceOf(t *testing.T, res invoice.Result, org string) invoice.Invoice {
	t.Helper()
	for _, inv := range res.Invoices {
		if inv.Org == org {
			return inv
		}
	}
	t.Fatalf("no invoice of %s", org)
	return invoice.Invoice{}
}

// A price change effective from next month leaves this month's invoice on the version
// before it; next month's invoice uses the new one, and late units of this month billed
// next month are still priced with this month's version.
func TestPriceChangeFromNextMonth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/eng")
	jan, feb := month(2025, time.January), month(2025, time.February)
	b.event(t, event{path: "acme/eng", at: jan.Add(time.Hour), requests: 6_000_000})
	b.event(t, event{path: "acme/eng", at: feb.Add(time.Hour), requests: 6_000_000})

	v2, err := b.addPrice(t, proV2(feb, 5900))
	require.NoError(t, err)
	require.Equal(t, 2, v2.Version)
	require.True(t, v2.EffectivePeriod.Equal(feb))

	res, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	acme := invoiceOf(t, res, "acme")
	require.Equal(t, 1, acme.PriceVersion)
	require.Equal(t, int64(4900+500), acme.TotalMinor, "version 1: 1,000,000 requests over at 50 per 100,000")
	b.tiesOut(t)

	b.event(t, event{path: "acme/eng", at: jan.Add(2 * time.Hour), requests: 100_000, late: true})
	res, err = invoice.Close(b.ctx, b.pool, feb, invoice.Options{Force: true})
	require.NoError(t, err)
	acme = invoiceOf(t, res, "acme")
	require.Equal(t, 2, acme.PriceVersion)
	var late int64
	for _, l := range acme.Lines {
		if l.Kind == invoice.KindLate {
			late += l.AmountMinor
		}
	}
	require.Equal(t, int64(50), late, "January's late units at January's version (50 per 100,000), not February's (100)")
	require.Equal(t, int64(5900+1000+50), acme.TotalMinor, "version 2: 1,000,000 requests over at 100 per 100,000")
	b.tiesOut(t)
}

// An issued invoice keeps the version it was priced with: a version effective in a closed
// period is refused, the rows of a version that priced an invoice cannot change, and a
// later version changes neither the invoice nor its tie-out.
func TestIssuedInvoiceKeepsItsVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro")
	jan, feb, mar := month(2025, time.January), month(2025, time.February), month(2025, time.March)
	b.event(t, event{path: "acme", at: jan.Add(time.Hour), requests: 6_000_000})
	res, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	before := invoiceOf(t, res, "acme")
	require.Equal(t, 1, before.PriceVersion)

	_, err = b.addPrice(t, proV2(jan, 5900))
	var inv *invoice.InvalidPriceError
	require.ErrorAs(t, err, &inv, "January is closed")
	require.Equal(t, "effective_period", inv.Field)
	_, err = b.addPrice(t, proV2(time.Time{}, 5900))
	require.ErrorAs(t, err, &inv, "a change needs its month")

	// Version 2 from March, then version 3 from February: 3 supersedes 2 from February on.
	_, err = b.addPrice(t, proV2(mar, 5900))
	require.NoError(t, err)
	_, err = b.addPrice(t, proV2(feb, 6900))
	require.NoError(t, err)
	versions, err := invoice.PriceVersions(b.ctx, b.pool, "pro")
	require.NoError(t, err)
	require.Len(t, versions, 3)
	for _, m := range []time.Time{jan, feb, mar, month(2026, time.July)} {
		v, ok := invoice.VersionAt(versions, m)
		require.True(t, ok)
		require.Equal(t, int64(v.Version), b.count(t, `select price_version('pro', $1)`, m), "Go and SQL agree on %s", m)
	}
	v, _ := invoice.VersionAt(versions, mar)
	require.Equal(t, 3, v.Version)

	for _, sql := range []string{
		`update plan_price_tiers set price_minor = 0 where plan = 'pro' and version = 1`,
		`update plan_prices set base_fee_minor = 0 where plan = 'pro' and version = 1`,
		`delete from plan_price_units where plan = 'pro' and version = 1 and unit = 'tokens'`,
		`insert into plan_price_units (plan, version, unit, included_units) values ('pro', 1, 'credits', 10)`,
		`delete from plans where id = 'pro'`,
	} {
		_, err := b.pool.Exec(b.ctx, sql)
		require.ErrorContains(t, err, "priced an issued invoice", sql)
	}

	res, err = invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	require.False(t, res.Created)
	require.Equal(t, before, invoiceOf(t, res, "acme"), "the issued invoice is unchanged")
	var buf bytes.Buffer
	require.NoError(t, invoice.Export(b.ctx, b.pool, jan, "acme", "json", &buf))
	var exported invoice.Invoice
	require.NoError(t, json.Unmarshal(buf.Bytes(), &exported))
	require.Equal(t, 1, exported.PriceVersion)
	b.tiesOut(t) // priced and checked with version 1, not the current one

	res, err = invoice.Close(b.ctx, b.pool, feb, invoice.Options{Force: true})
	require.NoError(t, err)
	require.Equal(t, 3, invoiceOf(t, res, "acme").PriceVersion)
	require.Equal(t, int64(6900), invoiceOf(t, res, "acme").TotalMinor)
	b.tiesOut(t)
}

func TestPlanValidate(t *testing.T) {
	t.Parallel()
	ok := invoice.Plan{ID: "p", Currency: "EUR", BaseFeeMinor: 100, Units: []invoice.UnitPrice{
		{Unit: "tokens", Included: 10, Tiers: []invoice.Tier{{From: 10, UpTo: 20, PriceMinor: 1, PerUnits: 1}, {From: 20, PriceMinor: 1, PerUnits: 1}}},
	}}
	require.NoError(t, ok.Validate())
	for _, tc := range []struct {
		name, field string
		change      func(p *invoice.Plan)
	}{
		{"lowercase currency", "currency", func(p *invoice.Plan) { p.Currency = "eur" }},
		{"long currency", "currency", func(p *invoice.Plan) { p.Currency = "EURO" }},
		{"negative base fee", "base_fee_minor", func(p *invoice.Plan) { p.BaseFeeMinor = -1 }},
		{"mid-month", "effective_period", func(p *invoice.Plan) { p.EffectivePeriod = month(2026, time.May).AddDate(0, 0, 3) }},
		{"unknown unit", "units", func(p *invoice.Plan) { p.Units[0].Unit = "apples" }},
		{"unit twice", "units", func(p *invoice.Plan) { p.Units = append(p.Units, p.Units[0]) }},
		{"gap", "units", func(p *invoice.Plan) { p.Units[0].Tiers[1].From = 21 }},
		{"descending", "units", func(p *invoice.Plan) { p.Units[0].Tiers[0].UpTo = 5 }},
		{"closed last tier", "units", func(p *invoice.Plan) { p.Units[0].Tiers[1].UpTo = 30 }},
		{"zero per units", "units", func(p *invoice.Plan) { p.Units[0].Tiers[0].PerUnits = 0 }},
		{"negative price", "units", func(p *invoice.Plan) { p.Units[0].Tiers[0].PriceMinor = -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ok
			p.Units = []invoice.UnitPrice{{Unit: "tokens", Included: 10, Tiers: append([]invoice.Tier(nil), ok.Units[0].Tiers...)}}
			tc.change(&p)
			var inv *invoice.InvalidPriceError
			require.True(t, errors.As(p.Validate(), &inv), "refused")
			require.Equal(t, tc.field, inv.Field)
		})
	}
}
