package invoice_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
)

// One org's bad data never stops the other orgs' invoices (issue 28, finding 3). Beside
// acme (pro) and small (free), three orgs whose invoice cannot be issued: huge, whose
// usage rows sum past bigint (9,300 requests of 10^15 tokens each); pricey, on a plan
// whose stored price does not validate (a gap between tiers); trap, whose invoice lines a
// trigger refuses (an error of PostgreSQL after its invoice row was written). The close
// issues acme's and small's invoices, closes the month and reports the three; a close of
// the next month issues acme's and holds huge back (its January invoice is missing). Once
// the data is fixed a close of January again issues the three missing invoices, once, and
// a close of February again issues huge's and pricey's February invoices.
func TestOneOrgsBadDataDoesNotStopTheClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jan, feb := month(2025, time.January), month(2025, time.February)
	b.org(t, "acme", "pro", "acme/eng")
	b.org(t, "small", "free")
	b.org(t, "huge", "pro")
	b.org(t, "trap", "pro")
	b.event(t, event{path: "acme/eng", at: jan.Add(time.Hour), requests: 6_000_000})
	b.event(t, event{path: "small", at: jan.Add(time.Hour), requests: 3})
	b.event(t, event{path: "trap", at: jan.Add(time.Hour), requests: 1})
	b.event(t, event{path: "acme/eng", at: feb.Add(time.Hour), requests: 1})

	_, err := b.pool.Exec(b.ctx, `
		insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind,
		                          path, source, requests, tokens, kafka_partition, kafka_offset)
		select 'huge-' || g, $1, $2, $1, 'huge', 'huge', 'org', '{huge}', 'test', 1, 1000000000000000, 1, g
		from generate_series(1, 9300) g`, jan, jan.Add(2*time.Hour))
	require.NoError(t, err)

	// pricey's plan: requests included up to 1,000, then a tier from 2,000 (a gap).
	for _, q := range []string{
		`insert into plans (id, rank) values ('broken', 9)`,
		`insert into plan_prices (plan, version, currency, base_fee_minor) values ('broken', 1, 'EUR', 100)`,
		`insert into plan_price_units (plan, version, unit, included_units) values ('broken', 1, 'requests', 1000)`,
		`insert into plan_price_tiers (plan, version, unit, from_units, up_to_units, price_minor, per_units)
		 values ('broken', 1, 'requests', 2000, null, 1, 1)`,
	} {
		_, err := b.pool.Exec(b.ctx, q)
		require.NoError(t, err, q)
	}
	b.org(t, "pricey", "broken")
	b.event(t, event{path: "pricey", at: jan.Add(time.Hour), requests: 1500})

	// trap: PostgreSQL refuses its lines, after its invoice row is in.
	for _, q := range []string{
		`create function trap_lines() returns trigger language plpgsql as $$
		 begin
		   if exists (select 1 from invoices where id = new.invoice_id and org = 'trap')
		      and not exists (select 1 from trap_released) then
		     raise exception 'trap refuses the lines of its invoice';
		   end if;
		   return new;
		 end $$`,
		`create table trap_released (released boolean)`,
		`create trigger trap_lines before insert on invoice_lines for each row execute function trap_lines()`,
	} {
		_, err := b.pool.Exec(b.ctx, q)
		require.NoError(t, err, q)
	}

	closeMonth := func(m time.Time) (invoice.Result, error) {
		return invoice.Close(b.ctx, b.pool, m, invoice.Options{Clock: period.Fixed(month(2025, time.June))})
	}
	orgs := func(invs []invoice.Invoice) []string {
		var out []string
		for _, i := range invs {
			out = append(out, i.Org)
		}
		return out
	}
	failedOrgs := func(res invoice.Result) map[string]string {
		out := map[string]string{}
		for _, f := range res.Failed {
			out[f.Org] = f.Error
		}
		return out
	}

	res, err := closeMonth(jan)
	require.ErrorIs(t, err, invoice.ErrInvoicesFailed)
	require.True(t, res.Created, "the month is closed for the orgs whose invoices are issued")
	require.Equal(t, 2, res.Issued)
	require.Equal(t, []string{"acme", "small"}, orgs(res.Invoices))
	require.Equal(t, int64(4900+ceilDiv(1_000_000*50, 100_000)), res.Invoices[0].TotalMinor, "acme priced as without the others")
	failed := failedOrgs(res)
	require.Len(t, failed, 3, "%v", res.Failed)
	require.Contains(t, failed["huge"], "past the largest quantity")
	require.Contains(t, failed["pricey"], "tier 0 starts at 2000, want 1000")
	require.Contains(t, failed["trap"], "trap refuses the lines")
	require.Equal(t, int64(1), b.count(t, `select count(*) from periods where period = $1`, jan))
	require.Zero(t, b.count(t, `select count(*) from invoices where org = 'trap'`), "trap's invoice row is rolled back with its lines")
	require.Equal(t, int64(3), b.count(t, `select count(*) from finance_invoice_failures where period = $1`, jan))
	b.tiesOut(t)

	// Closed again with nothing fixed: the three fail again, nothing else is written.
	res, err = closeMonth(jan)
	require.ErrorIs(t, err, invoice.ErrInvoicesFailed)
	require.False(t, res.Created)
	require.Zero(t, res.Issued)
	require.Len(t, res.Failed, 3)
	require.Equal(t, int64(2), b.count(t, `select count(*) from invoices`))
	require.Equal(t, int64(2), b.count(t, `select attempts from finance_invoice_failures where org = 'huge'`))

	// February: acme is invoiced; huge, pricey and trap wait for their January invoices.
	res, err = closeMonth(feb)
	require.ErrorIs(t, err, invoice.ErrInvoicesFailed)
	require.Equal(t, []string{"acme"}, orgs(res.Invoices))
	failed = failedOrgs(res)
	require.Len(t, failed, 3, "%v", res.Failed)
	require.Contains(t, failed["huge"], "invoice for 2025-01 is not issued")

	// The data is fixed: 9,299 of huge's requests voided, pricey's gap filled, trap released.
	for _, q := range []string{
		`insert into usage_voids (event_id, attempt, reason, void_time, source, kafka_partition, kafka_offset)
		 select 'huge-' || g, 'huge-' || g, 'unavailable', now(), 'test', 1, g from generate_series(2, 9300) g`,
		`insert into plan_price_tiers (plan, version, unit, from_units, up_to_units, price_minor, per_units)
		 values ('broken', 1, 'requests', 1000, 2000, 2, 1)`,
		`insert into trap_released values (true)`,
	} {
		_, err := b.pool.Exec(b.ctx, q)
		require.NoError(t, err, q)
	}
	res, err = closeMonth(jan)
	require.NoError(t, err)
	require.Equal(t, 3, res.Issued)
	require.Empty(t, res.Failed)
	require.Equal(t, []string{"acme", "huge", "pricey", "small", "trap"}, orgs(res.Invoices))
	byOrg := map[string]invoice.Invoice{}
	for _, i := range res.Invoices {
		byOrg[i.Org] = i
	}
	// huge: 1 request, 10^15 tokens: 10M included, 90M at 2 per 1,000, the rest at 1 per 1,000.
	require.Equal(t, int64(4900+180_000+ceilDiv(1_000_000_000_000_000-100_000_000, 1000)), byOrg["huge"].TotalMinor)
	require.Equal(t, int64(100+500*2), byOrg["pricey"].TotalMinor)
	require.Equal(t, int64(4900), byOrg["trap"].TotalMinor)
	require.Zero(t, b.count(t, `select count(*) from finance_invoice_failures where period = $1`, jan))

	res, err = closeMonth(jan)
	require.NoError(t, err, "nothing left to retry")
	require.Zero(t, res.Issued)
	require.Equal(t, int64(1), b.count(t, `select count(*) from invoices where org = 'huge' and period = $1`, jan), "issued once")

	res, err = closeMonth(feb)
	require.NoError(t, err)
	require.Equal(t, 3, res.Issued, "huge's, pricey's and trap's February invoices, after January's")
	require.Equal(t, []string{"acme", "huge", "pricey", "trap"}, orgs(res.Invoices))
	require.Zero(t, b.count(t, `select count(*) from finance_invoice_failures`))
	require.Equal(t, int64(9), b.count(t, `select count(*) from invoices`))
	b.tiesOut(t)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
