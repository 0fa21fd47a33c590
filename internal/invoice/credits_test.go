package invoice_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/testenv"
)

// grant adds a credit grant of units of unit to account (of org); returns its id.
func (b *testBundle) grant(t *testing.T, org, account, unit string, amount int64) string {
	t.Helper()
	id := fmt.Sprintf("gr_%032x", eventSeq.Add(1))
	_, err := b.pool.Exec(b.ctx, `insert into credit_grants (id, org, account, unit, amount, effective_at, source)
		values ($1, $2, $3, $4, $5, '2020-01-01', 'purchase')`, id, org, account, unit, amount)
	require.NoError(t, err)
	return id
}

// draw records what event (at its time, of org) drew from a grant of account, as the meter
// writes it.
func (b *testBundle) draw(t *testing.T, eventID string, at time.Time, org, grant, account, unit string, units int64) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `insert into credit_consumptions (event_id, grant_id, billing_period, charged_period, event_time, org, account, unit, units)
		values ($1, $2, $3, $3, $4, $5, $6, $7, $8)`, eventID, grant, period.MonthStart(at), at, org, account, unit, units)
	require.NoError(t, err)
}

// giveBack records reconcile's refund or settlement of units of an event's draw on a grant.
func (b *testBundle) giveBack(t *testing.T, kind, eventID, grant string, units int64) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `insert into credit_adjustments (kind, grant_id, event_id, units, reason) values ($1, $2, $3, $4, 'test')`,
		kind, grant, eventID, units)
	require.NoError(t, err)
}

// acmeWithCredits writes January 2025 of acme (pro): usage partly paid by a grant of the
// org's own account and partly drawn from a team's grant too; returns the org grant and the
// ids of the events e2 (acme/eng, covered) and e7 (a 5xx whose refund is not written yet).
func (b *testBundle) acmeWithCredits(t *testing.T, jan time.Time) (orgGrant, e2, e7 string) {
	t.Helper()
	b.org(t, "acme", "pro", "acme/eng", "acme/ml")
	orgGrant = b.grant(t, "acme", "acme", "requests", 7_000_000)
	team := b.grant(t, "acme", "eng", "requests", 5_000_000)
	at := func(h int) time.Time { return jan.Add(time.Duration(h) * time.Hour) }

	// e1: before the grant was bought, drew nothing.
	b.event(t, event{path: "acme/ml", at: at(1), requests: 21_234_567})
	// e2: drew its 2,500,000 from the org's grant and from the team's.
	e2 = b.event(t, event{path: "acme/eng", at: at(2), requests: 2_500_000})
	b.draw(t, e2, at(2), "acme", orgGrant, "acme", "requests", 2_500_000)
	b.draw(t, e2, at(2), "acme", team, "eng", "requests", 2_500_000)
	// e3: a 5xx, both draws refunded by reconcile.
	e3 := b.event(t, event{path: "acme/eng", at: at(3), requests: 1_000_000, status: 503})
	b.draw(t, e3, at(3), "acme", orgGrant, "acme", "requests", 1_000_000)
	b.draw(t, e3, at(3), "acme", team, "eng", "requests", 1_000_000)
	b.giveBack(t, "refund", e3, orgGrant, 1_000_000)
	b.giveBack(t, "refund", e3, team, 1_000_000)
	// e4: at the org, drew 2,000,000.
	e4 := b.event(t, event{path: "acme", at: at(4), requests: 2_000_000})
	b.draw(t, e4, at(4), "acme", orgGrant, "acme", "requests", 2_000_000)
	// e6: admitted 600,000, the outcome reported 500,000; reconcile settled 100,000 back.
	e6 := b.event(t, event{path: "acme/ml", at: at(6), requests: 600_000, status: 200})
	_, err := b.pool.Exec(b.ctx, `update usage_outcomes set requests = 500000 where event_id = $1`, e6)
	require.NoError(t, err)
	b.draw(t, e6, at(6), "acme", orgGrant, "acme", "requests", 600_000)
	b.giveBack(t, "settle", e6, orgGrant, 100_000)
	// e7: a 5xx that drew 300,000; reconcile has not refunded it yet.
	e7 = b.event(t, event{path: "acme/eng", at: at(7), requests: 300_000, status: 502})
	b.draw(t, e7, at(7), "acme", orgGrant, "acme", "requests", 300_000)
	return orgGrant, e2, e7
}

// An invoice bills, by the plan's tiers, only the usage the org's own credits did not pay
// for, and shows the covered units as a credits_applied line of amount 0.
//
// Hand-computed (pro: 5,000,000 requests included; 50 per 100,000 up to 20,000,000; then
// 30 per 100,000; base fee 4,900):
//
//	billable requests: e1 21,234,567 + e2 2,500,000 + e3 0 (5xx) + e4 2,000,000
//	                   + e6 500,000 (actual) + e7 0 (5xx)              = 26,234,567
//	usage lines: acme 2,000,000; acme/eng 2,500,000; acme/ml 21,734,567
//	covered by the org's grant (net draws, at most what each request bills):
//	                   e2 2,500,000 + e3 (1,000,000 − 1,000,000 refunded) 0 + e4 2,000,000
//	                   + e6 (600,000 − 100,000 settled) 500,000 + e7 min(300,000, 0) 0
//	                                                                   =  5,000,000
//	  (the team's grant, drawn by e2 and e3, is an internal allocation: not counted)
//	priced: 26,234,567 − 5,000,000 = 21,234,567
//	  included 5,000,000                                  0
//	  tier 1 15,000,000 × 50 / 100,000                7,500
//	  tier 2  1,234,567 × 30 / 100,000 = 370.37 →      371
//	total 4,900 + 7,500 + 371 = 12,771 (without the credits: 26,234,567 would cost
//	7,500 + ceil(6,234,567 × 30 / 100,000) = 1,871 more, 14,271 in all).
func TestInvoiceAppliesCredits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jan := month(2025, time.January)
	b.acmeWithCredits(t, jan)

	res, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	acme := invoiceOf(t, res, "acme")
	require.Equal(t, []invoice.Line{
		{Kind: invoice.KindBaseFee, AccountPath: "acme", Quantity: 1, UnitPriceMinor: 4900, PerUnits: 1, AmountMinor: 4900},
		{Kind: invoice.KindUsage, AccountPath: "acme", Unit: "requests", Quantity: 2_000_000, PerUnits: 1},
		{Kind: invoice.KindUsage, AccountPath: "acme/eng", Unit: "requests", Quantity: 2_500_000, PerUnits: 1},
		{Kind: invoice.KindUsage, AccountPath: "acme/ml", Unit: "requests", Quantity: 21_734_567, PerUnits: 1},
		{Kind: invoice.KindCreditsApplied, AccountPath: "acme", Unit: "requests", Quantity: 5_000_000, PerUnits: 1},
		{Kind: invoice.KindIncluded, AccountPath: "acme", Unit: "requests", Quantity: 5_000_000, PerUnits: 1},
		{Kind: invoice.KindOverageTier, AccountPath: "acme", Unit: "requests", Quantity: 15_000_000, UnitPriceMinor: 50, PerUnits: 100_000, AmountMinor: 7500},
		{Kind: invoice.KindOverageTier, AccountPath: "acme", Unit: "requests", Quantity: 1_234_567, UnitPriceMinor: 30, PerUnits: 100_000, AmountMinor: 371},
		{Kind: invoice.KindIncluded, AccountPath: "acme", Unit: "tokens", PerUnits: 1},
	}, acme.Lines)
	require.Equal(t, int64(12_771), acme.TotalMinor)
	require.Equal(t, int64(12_771), acme.SubtotalMinor)
	b.tiesOut(t)

	// The tie-out checks the credits line: one written behind the close's back is a
	// difference (usage against credits applied + included + overage).
	err = testenv.ExecUnsealed(b.ctx, b.pool, "invoice_lines", `insert into invoice_lines (invoice_id, line_no, kind, account_path, unit, quantity, amount_minor)
		values ($1, 100, 'credits_applied', 'acme', 'requests', 1, 0)`, acme.ID)
	require.NoError(t, err)
	require.Equal(t, int64(1), b.count(t, `select count(*) from finance_invoice_tieout where invoice_id = $1 and "check" = 'included + overage quantity = usage'`, acme.ID))
}

// A grant of an account below the org (a team's budget) is an internal allocation: its
// draws change no invoice. beta's team drew 6,000,000 of its 8,000,000 requests from its
// grant; beta is billed all 8,000,000: 5,000,000 included, 3,000,000 × 50 / 100,000 = 1,500.
func TestTeamGrantDoesNotChangeTheInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jan := month(2025, time.January)
	b.org(t, "beta", "pro", "beta/eng")
	team := b.grant(t, "beta", "eng", "requests", 6_000_000)
	b.event(t, event{path: "beta/eng", at: jan.Add(time.Hour), requests: 2_000_000})
	drew := b.event(t, event{path: "beta/eng", at: jan.Add(2 * time.Hour), requests: 6_000_000})
	b.draw(t, drew, jan.Add(2*time.Hour), "beta", team, "eng", "requests", 6_000_000)

	res, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	beta := invoiceOf(t, res, "beta")
	for _, l := range beta.Lines {
		require.NotEqual(t, invoice.KindCreditsApplied, l.Kind)
	}
	require.Equal(t, int64(4900+1500), beta.TotalMinor)
	b.tiesOut(t)
}

// Late events' draws and outcomes reported after the close follow the same rule on the next
// invoice; the closed month's invoice does not change.
//
// January as in TestInvoiceAppliesCredits: billed 26,234,567, covered 5,000,000, priced
// 21,234,567 (371 in tier 2). After the close:
//   - e2's outcome is a 5xx: it bills nothing and covers nothing (its refund is not written
//     yet): billable 23,734,567, covered 2,500,000, priced still 21,234,567: an adjustment
//     of −2,500,000 units for 0, and credits applied −2,500,000;
//   - late e8 (acme/eng) drew its 400,000 from the org's grant: late 400,000 for
//     price(21,234,567) − price(21,234,567) = 0, credits applied 400,000;
//   - late e9 (acme/ml), 200,000, drew nothing: price(21,434,567) − price(21,234,567) =
//     ceil(1,434,567 × 30 / 100,000 = 430.37) − 371 = 431 − 371 = 60.
//
// February (no usage of its own): 4,900 + 0 + 0 + 60 = 4,960.
func TestLateDrawsAndCorrectionsApplyCredits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jan, feb := month(2025, time.January), month(2025, time.February)
	orgGrant, e2, _ := b.acmeWithCredits(t, jan)
	first, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	require.Equal(t, int64(12_771), invoiceOf(t, first, "acme").TotalMinor)

	_, err = b.pool.Exec(b.ctx, `insert into usage_outcomes (event_id, status, outcome_time, source, kafka_partition, kafka_offset)
		values ($1, 503, $2, 'test', 0, 1)`, e2, jan.Add(2*time.Hour))
	require.NoError(t, err)
	e8 := b.event(t, event{path: "acme/eng", at: jan.Add(8 * time.Hour), requests: 400_000})
	b.draw(t, e8, jan.Add(8*time.Hour), "acme", orgGrant, "acme", "requests", 400_000)
	b.event(t, event{path: "acme/ml", at: jan.Add(9 * time.Hour), requests: 200_000, late: true})
	require.Equal(t, int64(1), b.count(t, `select count(*) from finance_invoice_tieout where "check" = 'credits applied for the period = covered usage'`),
		"the tie-out shows the covered units of the 5xx waiting for the next invoice")

	res, err := invoice.Close(b.ctx, b.pool, feb, invoice.Options{Force: true})
	require.NoError(t, err)
	acme := invoiceOf(t, res, "acme")
	var extra []invoice.Line
	for _, l := range acme.Lines {
		if l.ForPeriod != "" {
			extra = append(extra, l)
		}
	}
	require.Equal(t, []invoice.Line{
		{Kind: invoice.KindAdjustment, AccountPath: "acme", Unit: "requests", Quantity: -2_500_000, PerUnits: 1, ForPeriod: "2025-01-01"},
		{Kind: invoice.KindCreditsApplied, AccountPath: "acme", Unit: "requests", Quantity: -2_500_000, PerUnits: 1, ForPeriod: "2025-01-01"},
		{Kind: invoice.KindLate, AccountPath: "acme/eng", Unit: "requests", Quantity: 400_000, PerUnits: 1, ForPeriod: "2025-01-01"},
		{Kind: invoice.KindCreditsApplied, AccountPath: "acme/eng", Unit: "requests", Quantity: 400_000, PerUnits: 1, ForPeriod: "2025-01-01"},
		{Kind: invoice.KindLate, AccountPath: "acme/ml", Unit: "requests", Quantity: 200_000, PerUnits: 1, AmountMinor: 60, ForPeriod: "2025-01-01"},
	}, extra)
	require.Equal(t, int64(4960), acme.TotalMinor)
	b.tiesOut(t)

	// Reconcile refunds e2's draws later: nothing more to bill, the books still tie out.
	b.giveBack(t, "refund", e2, orgGrant, 2_500_000)
	require.Equal(t, int64(0), b.count(t, `select count(*) from finance_period_billing
		where billed_quantity <> billable_quantity or billed_covered <> covered_quantity`))
	b.tiesOut(t)

	// January's invoice is as issued.
	again, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Equal(t, first.Invoices, again.Invoices)
}
