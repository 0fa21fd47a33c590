package invoice_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// testBundle is a migrated schema of the test's own: periods are global to a schema (a
// closed month is closed for every org), so tests that close periods do not share one.
type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

func setup(t testing.TB) *testBundle {
	t.Helper()
	pool, _ := testenv.EmptySchema(t)
	ctx := testenv.Context(t, 2*time.Minute)
	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	return &testBundle{ctx: ctx, pool: pool}
}

func month(y int, m time.Month) time.Time { return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC) }

// org adds an org on plan with the given descendants (each "parent/child" path below it).
func (b *testBundle) org(t *testing.T, id, plan string, paths ...string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `insert into accounts (id, kind, org, plan, created_at) values ($1, 'org', $1, $2, '2020-01-01')`, id, plan)
	require.NoError(t, err)
	kinds := []string{"org", "team", "user", "agent"}
	for _, p := range paths {
		parts := strings.Split(p, "/")
		_, err := b.pool.Exec(b.ctx, `insert into accounts (id, kind, parent, org) values ($1, $2, $3, $4) on conflict do nothing`,
			parts[len(parts)-1], kinds[len(parts)-1], parts[len(parts)-2], id)
		require.NoError(t, err)
	}
}

var eventSeq atomic.Int64

type event struct {
	path     string // org first, "/"-joined
	at       time.Time
	requests int64
	tokens   int64
	late     bool
	status   int // outcome status; 0 = no outcome
}

// event inserts one admitted request (and its outcome when status is set); returns its id.
func (b *testBundle) event(t *testing.T, e event) string {
	t.Helper()
	month := period.MonthStart(e.at)
	_, err := b.pool.Exec(b.ctx, `select usage_events_partition($1)`, month)
	require.NoError(t, err)
	path := strings.Split(e.path, "/")
	kinds := []string{"org", "team", "user", "agent"}
	id := fmt.Sprintf("ev-%d", eventSeq.Add(1))
	_, err = b.pool.Exec(b.ctx, `
		insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind,
		                          path, source, requests, tokens, late, kafka_partition, kafka_offset)
		values ($1, $2, $3, $2, $4, $5, $6, $7, 'test', $8, $9, $10, 0, $11)`,
		id, month, e.at, path[0], path[len(path)-1], kinds[len(path)-1], path, e.requests, e.tokens, e.late, eventSeq.Load())
	require.NoError(t, err)
	if e.status != 0 {
		_, err = b.pool.Exec(b.ctx, `insert into usage_outcomes (event_id, status, outcome_time, source, kafka_partition, kafka_offset)
			values ($1, $2, $3, 'test', 0, $4)`, id, e.status, e.at, eventSeq.Load())
		require.NoError(t, err)
	}
	return id
}

// tiesOut requires the tie-out view to be empty.
func (b *testBundle) tiesOut(t *testing.T) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `select invoice_id, org, period::text, "check", coalesce(unit, ''), expected::text, actual::text from finance_invoice_tieout`)
	require.NoError(t, err)
	defer rows.Close()
	var diffs []string
	for rows.Next() {
		var id int64
		var org, period, check, unit, expected, actual string
		require.NoError(t, rows.Scan(&id, &org, &period, &check, &unit, &expected, &actual))
		diffs = append(diffs, fmt.Sprintf("invoice %d (%s %s) %s %s: expected %s, actual %s", id, org, period, check, unit, expected, actual))
	}
	require.NoError(t, rows.Err())
	require.Empty(t, diffs, "every invoice ties out")
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

func TestCloseRefusedBeforeTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro")
	mar := month(2025, time.March)

	for _, now := range []time.Time{mar.AddDate(0, 0, 20), month(2025, time.April).Add(invoice.DefaultGrace - time.Second)} {
		_, err := invoice.Close(b.ctx, b.pool, mar, invoice.Options{Clock: period.Fixed(now)})
		require.ErrorIs(t, err, invoice.ErrTooEarly, "now %s", now)
	}
	_, err := invoice.Close(b.ctx, b.pool, mar, invoice.Options{Clock: period.Fixed(month(2025, time.April).Add(time.Hour)), Grace: 2 * time.Hour})
	require.ErrorIs(t, err, invoice.ErrTooEarly, "a custom grace")
	require.Zero(t, b.count(t, `select count(*) from periods`), "a refused close writes nothing")

	res, err := invoice.Close(b.ctx, b.pool, mar, invoice.Options{Clock: period.Fixed(mar.AddDate(0, 0, 20)), Force: true})
	require.NoError(t, err, "Force closes early")
	require.True(t, res.Created)
	require.Len(t, res.Invoices, 1, "an org on a plan with a base fee is invoiced without usage")
	require.Equal(t, int64(4900), res.Invoices[0].TotalMinor)

	apr := month(2025, time.April)
	res, err = invoice.Close(b.ctx, b.pool, apr, invoice.Options{Clock: period.Fixed(month(2025, time.May).Add(invoice.DefaultGrace))})
	require.NoError(t, err, "allowed at end + grace")
	require.True(t, res.Created)

	_, err = invoice.Close(b.ctx, b.pool, month(2025, time.February), invoice.Options{Force: true})
	require.ErrorIs(t, err, invoice.ErrLaterPeriodClosed)
	b.tiesOut(t)
}

func TestProInvoiceMatchesFixtureAndTiesOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := loadFixture(t)
	b.org(t, "acme", "pro", "acme/eng", "acme/eng/bob", "acme/ml")
	b.org(t, "small", "free")
	jan := month(2025, time.January)
	for i, u := range f.Usage {
		b.event(t, event{path: strings.Join(u.Path, "/"), at: jan.Add(time.Duration(i+1) * time.Hour), requests: u.Requests, tokens: u.Tokens})
	}
	// Not billed: a request refunded (5xx), and usage of the next month.
	b.event(t, event{path: "acme/eng", at: jan.Add(48 * time.Hour), requests: 1000, tokens: 5000, status: 503})
	b.event(t, event{path: "acme/eng", at: month(2025, time.February), requests: 7})
	// A request whose outcome was a success is billed as admitted.
	b.event(t, event{path: "small", at: jan.Add(time.Hour), requests: 3, status: 200})

	res, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Clock: period.Fixed(month(2025, time.June))})
	require.NoError(t, err)
	require.Len(t, res.Invoices, 2)
	acme := res.Invoices[0]
	require.Equal(t, "acme", acme.Org)
	require.Equal(t, "EUR", acme.Currency)
	require.Equal(t, "pro", acme.Plan)
	require.Equal(t, f.Lines, acme.Lines, "the seeded pro prices give the hand-computed lines")
	require.Equal(t, f.TotalMinor, acme.TotalMinor)
	require.Equal(t, f.TotalMinor, acme.SubtotalMinor)

	small := res.Invoices[1]
	require.Equal(t, "small", small.Org)
	require.Equal(t, int64(0), small.TotalMinor)
	require.Equal(t, []invoice.Line{
		{Kind: invoice.KindBaseFee, AccountPath: "small", Quantity: 1, PerUnits: 1},
		{Kind: invoice.KindUsage, AccountPath: "small", Unit: "requests", Quantity: 3, PerUnits: 1},
		{Kind: invoice.KindIncluded, AccountPath: "small", Unit: "requests", Quantity: 3, PerUnits: 1},
	}, small.Lines)

	b.tiesOut(t)

	// The tie-out view sees a difference: a line written behind the close's back.
	// (Sealed: only the owner, with the triggers off, can write it.)
	err = testenv.ExecUnsealed(b.ctx, b.pool, "invoice_lines", `insert into invoice_lines (invoice_id, line_no, kind, account_path, amount_minor) values ($1, 100, 'adjustment', 'acme', 1)`, acme.ID)
	require.NoError(t, err)
	require.Equal(t, int64(1), b.count(t, `select count(*) from finance_invoice_tieout where invoice_id = $1 and "check" = 'subtotal = sum of lines'`, acme.ID))
}

func TestSecondCloseIsANoOp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/eng")
	jan := month(2025, time.January)
	b.event(t, event{path: "acme/eng", at: jan.Add(time.Hour), requests: 6_000_000})
	first, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	require.True(t, first.Created)
	invoices, lines := b.count(t, `select count(*) from invoices`), b.count(t, `select count(*) from invoice_lines`)

	second, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	require.False(t, second.Created)
	require.Equal(t, first.Invoices, second.Invoices, "the existing invoices are returned")
	require.True(t, first.ClosedAt.Equal(second.ClosedAt))
	require.Equal(t, invoices, b.count(t, `select count(*) from invoices`))
	require.Equal(t, lines, b.count(t, `select count(*) from invoice_lines`))
	require.Equal(t, int64(1), b.count(t, `select count(*) from periods`))
	b.tiesOut(t)
}

func TestIssuedInvoicesAreImmutable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro")
	res, err := invoice.Close(b.ctx, b.pool, month(2025, time.January), invoice.Options{Force: true})
	require.NoError(t, err)
	id := res.Invoices[0].ID
	lines := b.count(t, `select count(*) from invoice_lines where invoice_id = $1`, id)
	for _, sql := range []string{
		`update invoices set total_minor = 0 where id = $1`,
		`update invoices set status = 'issued' where id = $1`,
		`delete from invoices where id = $1`,
		`update invoice_lines set amount_minor = 0 where invoice_id = $1`,
		`delete from invoice_lines where invoice_id = $1`,
	} {
		_, err := b.pool.Exec(b.ctx, sql, id)
		require.ErrorContains(t, err, "immutable", sql)
	}
	for _, table := range []string{"invoice_lines", "invoices"} {
		_, err := b.pool.Exec(b.ctx, `truncate `+table+` cascade`)
		require.ErrorContains(t, err, "immutable", table)
	}
	require.Equal(t, int64(4900), b.count(t, `select total_minor from invoices where id = $1`, id))
	require.Equal(t, lines, b.count(t, `select count(*) from invoice_lines where invoice_id = $1`, id))
}

func TestLateEventsAreBilledOnTheNextInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/eng")
	b.org(t, "gone", "pro")
	jan, feb, mar := month(2025, time.January), month(2025, time.February), month(2025, time.March)
	b.event(t, event{path: "acme/eng", at: jan.Add(time.Hour), requests: 5_000_000})
	_, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)

	// After January's close: one event ingested after closed_at, one flagged late by the
	// meter, a refunded one (billed 0), and February's own usage.
	late1 := b.event(t, event{path: "acme/eng", at: jan.Add(2 * time.Hour), requests: 150_000})
	late2 := b.event(t, event{path: "acme", at: jan.Add(3 * time.Hour), requests: 50_001, late: true})
	b.event(t, event{path: "acme", at: jan.Add(4 * time.Hour), requests: 9_000_000, status: 500})
	b.event(t, event{path: "acme/eng", at: feb.Add(time.Hour), requests: 10})
	require.Equal(t, int64(3), b.count(t, `select count(*) from finance_late_events where billed_on is null`))
	b.tiesOut(t) // late events are not January's invoice's business

	res, err := invoice.Close(b.ctx, b.pool, feb, invoice.Options{Force: true})
	require.NoError(t, err)
	var acme invoice.Invoice
	for _, inv := range res.Invoices {
		if inv.Org == "acme" {
			acme = inv
		}
	}
	var late []invoice.Line
	for _, l := range acme.Lines {
		if l.Kind == invoice.KindLate {
			late = append(late, l)
		}
	}
	// January billed exactly its 5,000,000 included requests: the late 200,001 are priced
	// at the margin, 50 per 100,000 rounded up per line: acme first (50,001 → 26), then
	// acme/eng (price(5,200,001) − price(5,050,001) = 101 − 26 = 75).
	require.Equal(t, []invoice.Line{
		{Kind: invoice.KindLate, AccountPath: "acme", Unit: "requests", Quantity: 50_001, PerUnits: 1, AmountMinor: 26, ForPeriod: "2025-01-01"},
		{Kind: invoice.KindLate, AccountPath: "acme/eng", Unit: "requests", Quantity: 150_000, PerUnits: 1, AmountMinor: 75, ForPeriod: "2025-01-01"},
	}, late)
	require.Equal(t, int64(4900+26+75), acme.TotalMinor, "base fee, February's 10 requests included, the late lines")
	require.Equal(t, int64(0), b.count(t, `select count(*) from finance_late_events where billed_on is null`))
	require.Equal(t, int64(2), b.count(t, `select count(*) from invoice_late_events where invoice_id = $1 and event_id = any($2)`,
		acme.ID, []string{late1, late2}))
	b.tiesOut(t)

	// Billed once: March's invoice has no late lines.
	res, err = invoice.Close(b.ctx, b.pool, mar, invoice.Options{Force: true})
	require.NoError(t, err)
	for _, inv := range res.Invoices {
		for _, l := range inv.Lines {
			require.NotEqual(t, invoice.KindLate, l.Kind, "org %s", inv.Org)
		}
	}
	b.tiesOut(t)
}

func TestExport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := loadFixture(t)
	b.org(t, "acme", "pro", "acme/eng", "acme/eng/bob", "acme/ml")
	jan := month(2025, time.January)
	for i, u := range f.Usage {
		b.event(t, event{path: strings.Join(u.Path, "/"), at: jan.Add(time.Duration(i+1) * time.Hour), requests: u.Requests, tokens: u.Tokens})
	}
	_, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)

	var js bytes.Buffer
	require.NoError(t, invoice.Export(b.ctx, b.pool, jan, "acme", "json", &js))
	var inv invoice.Invoice
	require.NoError(t, json.Unmarshal(js.Bytes(), &inv))
	require.Equal(t, f.Lines, inv.Lines)
	require.Equal(t, f.TotalMinor, inv.TotalMinor)
	require.Equal(t, "2025-01-01", inv.Period)

	var cs bytes.Buffer
	require.NoError(t, invoice.Export(b.ctx, b.pool, jan, "acme", "csv", &cs))
	records, err := csv.NewReader(&cs).ReadAll()
	require.NoError(t, err)
	require.Len(t, records, 1+len(f.Lines))
	header := records[0]
	col := func(name string) int {
		for i, h := range header {
			if h == name {
				return i
			}
		}
		t.Fatalf("no column %s in %v", name, header)
		return -1
	}
	var sum int64
	for i, r := range records[1:] {
		want := f.Lines[i]
		require.Equal(t, want.Kind, r[col("kind")])
		require.Equal(t, want.AccountPath, r[col("account_path")])
		require.Equal(t, fmt.Sprint(want.Quantity), r[col("quantity")])
		require.Equal(t, fmt.Sprint(want.AmountMinor), r[col("amount_minor")])
		require.Equal(t, "EUR", r[col("currency")])
		sum += want.AmountMinor
	}
	require.Equal(t, f.TotalMinor, sum)

	require.ErrorIs(t, invoice.Export(b.ctx, b.pool, jan, "nobody", "csv", &cs), invoice.ErrNotFound)
	require.Error(t, invoice.Export(b.ctx, b.pool, jan, "acme", "xml", &cs))
}

func TestOutcomesAfterTheCloseAreCorrectedOnTheNextInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/eng")
	jan, feb := month(2025, time.January), month(2025, time.February)
	b.event(t, event{path: "acme/eng", at: jan.Add(time.Hour), requests: 5_100_000})
	refunded := b.event(t, event{path: "acme/eng", at: jan.Add(2 * time.Hour), requests: 100_000})
	res, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
	require.NoError(t, err)
	require.Equal(t, int64(4900+100), res.Invoices[0].TotalMinor, "200,000 requests over at 50 per 100,000")

	// After the close: the 5xx outcome of a January request, and a late January event.
	_, err = b.pool.Exec(b.ctx, `insert into usage_outcomes (event_id, status, outcome_time, source, kafka_partition, kafka_offset)
		values ($1, 503, $2, 'test', 0, 1)`, refunded, jan.Add(2*time.Hour))
	require.NoError(t, err)
	b.event(t, event{path: "acme/eng", at: jan.Add(3 * time.Hour), requests: 30_001})
	require.Equal(t, int64(1), b.count(t, `select count(*) from finance_invoice_tieout where "check" = 'billed for the period = billable usage'`),
		"the tie-out shows the refund waiting for the next invoice")

	res, err = invoice.Close(b.ctx, b.pool, feb, invoice.Options{Force: true})
	require.NoError(t, err)
	require.Len(t, res.Invoices, 1)
	var extra []invoice.Line
	for _, l := range res.Invoices[0].Lines {
		if l.ForPeriod != "" {
			extra = append(extra, l)
		}
	}
	// Billed 5,200,000 (100); billable 5,100,000 (50): −50. Then the late 30,001 at the
	// margin: price(5,130,001) = ceil(65.0005) = 66, − 50 = 16.
	require.Equal(t, []invoice.Line{
		{Kind: invoice.KindAdjustment, AccountPath: "acme", Unit: "requests", Quantity: -100_000, PerUnits: 1, AmountMinor: -50, ForPeriod: "2025-01-01"},
		{Kind: invoice.KindLate, AccountPath: "acme/eng", Unit: "requests", Quantity: 30_001, PerUnits: 1, AmountMinor: 16, ForPeriod: "2025-01-01"},
	}, extra)
	require.Equal(t, int64(4900-50+16), res.Invoices[0].TotalMinor)
	b.tiesOut(t)
}

func TestConcurrentClosesIssueOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/eng")
	jan := month(2025, time.January)
	b.event(t, event{path: "acme/eng", at: jan.Add(time.Hour), requests: 6_000_000})
	const n = 4
	results := make(chan invoice.Result, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			res, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
			results <- res
			errs <- err
		}()
	}
	created := 0
	var first []invoice.Invoice
	for range n {
		require.NoError(t, <-errs)
		res := <-results
		if res.Created {
			created++
		}
		if first == nil {
			first = res.Invoices
		}
		require.Equal(t, first, res.Invoices, "every close returns the same invoices")
	}
	require.Equal(t, 1, created)
	require.Equal(t, int64(1), b.count(t, `select count(*) from invoices`))
	b.tiesOut(t)
}

// A meter transaction writing the month when the close starts is waited for, and its rows
// are on the invoice: the close reads exactly what was ingested by closed_at.
func TestCloseWaitsForInFlightMeterWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.org(t, "acme", "pro", "acme/eng")
	jan := month(2025, time.January)
	b.event(t, event{path: "acme/eng", at: jan.Add(time.Hour), requests: 1})

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = tx.Exec(b.ctx, `
		insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind,
		                          path, source, requests, kafka_partition, kafka_offset)
		values ('in-flight', $1, $2, $1, 'acme', 'eng', 'team', '{acme,eng}', 'test', 41, 0, 1)`, jan, jan.Add(time.Hour))
	require.NoError(t, err)

	done := make(chan invoice.Result, 1)
	go func() {
		res, err := invoice.Close(b.ctx, b.pool, jan, invoice.Options{Force: true})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	// Poll until the close waits on the partition's lock.
	require.Eventually(t, func() bool {
		return b.count(t, `select count(*) from pg_locks where not granted and relation = 'usage_events_2025_01'::regclass`) > 0
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, tx.Commit(b.ctx))

	res := <-done
	require.Len(t, res.Invoices, 1)
	var qty int64
	for _, l := range res.Invoices[0].Lines {
		if l.Kind == invoice.KindUsage {
			qty += l.Quantity
		}
	}
	require.Equal(t, int64(42), qty)
	b.tiesOut(t)
}
