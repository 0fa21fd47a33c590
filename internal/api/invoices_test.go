package api_test

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
)

// testIssuer issues the invoices of the tests (setupOpts.invoices).
var testIssuer = invoice.Issuer{Prefix: "MG", Seller: document.Party{
	LegalName: "Metergate Test GmbH", Address: []string{"Teststraße 1"}, City: "Berlin", PostalCode: "10115",
	Country: "DE", Email: "billing@metergate.example", TaxID: "DE123456789"}}

// closedMonth is the month the tests invoice: long past, so that the fixture's orgs
// (created in 2020) are due and nothing else in the schema is.
var closedMonth = time.Date(2025, time.March, 1, 0, 0, 0, 0, time.UTC)

// orgRow inserts an org on plan pro, created long before closedMonth.
func (b *testBundle) orgRow(t *testing.T, id string) string {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, org, plan, created_at) VALUES ($1, 'org', $1, 'pro', '2020-01-01')`, id)
	require.NoError(t, err)
	return id
}

// usageRow inserts one admitted request of org in closedMonth, as the meter writes it.
func (b *testBundle) usageRow(t *testing.T, org string, requests, tokens int64) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `SELECT usage_events_partition($1)`, closedMonth)
	require.NoError(t, err)
	n := b.count(t, `SELECT count(*) FROM usage_events`)
	_, err = b.pool.Exec(b.ctx, `
		INSERT INTO usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind,
		                          path, source, requests, tokens, late, kafka_partition, kafka_offset)
		VALUES ($1, $2, $3, $2, $4, $4, 'org', ARRAY[$4], 'test', $5, $6, false, 0, $7)`,
		fmt.Sprintf("ev-%d.%s", n, org), closedMonth, closedMonth.Add(36*time.Hour), org, requests, tokens, n)
	require.NoError(t, err)
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

// closeMonth closes closedMonth as reconcile's close would, issuing as testIssuer, and
// returns the invoices by org.
func (b *testBundle) closeMonth(t *testing.T) map[string]invoice.Invoice {
	t.Helper()
	res, err := invoice.Close(b.ctx, b.pool, closedMonth, invoice.Options{
		Clock: period.Fixed(closedMonth.AddDate(0, 1, 9)), Issuer: testIssuer, By: "api test"})
	require.NoError(t, err)
	out := map[string]invoice.Invoice{}
	for _, inv := range res.Invoices {
		out[inv.Org] = inv
	}
	return out
}

// invoiceFixture is three orgs invoiced for closedMonth: acme with billing details (19 %
// tax) and 12,345,678 tokens, beta and gamma with the base fee alone.
type invoiceFixture struct {
	acme, beta, gamma string
	invoices          map[string]invoice.Invoice
}

func (b *testBundle) invoiceFixture(t *testing.T) invoiceFixture {
	t.Helper()
	f := invoiceFixture{acme: b.orgRow(t, b.id("acme")), beta: b.orgRow(t, b.id("beta")), gamma: b.orgRow(t, b.id("gamma"))}
	r := b.call(t, "PUT", "/v1/admin/accounts/"+f.acme+"/billing", adminToken, map[string]any{
		"legal_name": "Acme AG", "address": []string{"Hauptstraße 5", "3. OG"}, "city": "München", "postal_code": "80331",
		"country": "DE", "email": "ap@acme.example", "tax_id": "DE999999999", "currency": "EUR", "tax_rate_bp": 1900})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	b.usageRow(t, f.acme, 1000, 12_000_000)
	b.usageRow(t, f.acme, 500, 345_678)
	f.invoices = b.closeMonth(t)
	require.Len(t, f.invoices, 3)
	return f
}

// getJSON GETs path with the admin token into v, wanting 200.
func (b *testBundle) getJSON(t *testing.T, path string, v any) reply {
	t.Helper()
	r := b.call(t, "GET", path, adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.NoError(t, json.Unmarshal([]byte(r.Raw), v), r.Raw)
	return r
}

// The invoices API lists with filters and pages, and gives an invoice as JSON with its
// number, lines, tax and totals, and rendered as PDF, HTML and CSV from the same numbers.
func TestInvoicesListAndDocuments(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, invoices: true})
	f := b.invoiceFixture(t)

	type page struct {
		Invoices  []invoice.Invoice `json:"invoices"`
		NextAfter *int64            `json:"next_after"`
	}
	var all page
	b.getJSON(t, "/v1/admin/invoices", &all)
	require.Len(t, all.Invoices, 3)
	require.Nil(t, all.NextAfter)
	for _, inv := range all.Invoices {
		require.Empty(t, inv.Lines, "a list leaves the lines out")
		require.Equal(t, "2025-03-01", inv.Period)
	}
	for query, want := range map[string]int{
		"?org=" + f.acme: 1, "?period=2025-03": 3, "?period=2025-04": 0, "?status=issued": 3, "?status=paid": 0,
		"?org=" + f.beta + "&period=2025-03&status=issued": 1,
	} {
		var p page
		b.getJSON(t, "/v1/admin/invoices"+query, &p)
		require.Len(t, p.Invoices, want, query)
	}
	var first, second page
	b.getJSON(t, "/v1/admin/invoices?limit=2", &first)
	require.Len(t, first.Invoices, 2)
	require.NotNil(t, first.NextAfter)
	require.Equal(t, first.Invoices[1].ID, *first.NextAfter)
	b.getJSON(t, fmt.Sprintf("/v1/admin/invoices?limit=2&after=%d", *first.NextAfter), &second)
	require.Len(t, second.Invoices, 1)
	require.Nil(t, second.NextAfter)
	require.Greater(t, second.Invoices[0].ID, first.Invoices[1].ID)

	// acme, by hand: base fee 4900; 12,345,678 tokens, 10,000,000 included, 2,345,678 at
	// 2 per 1,000 rounded up = 4692; subtotal 9592; 19 % tax = 1822.48 → 1822; total 11414.
	id := f.invoices[f.acme].ID
	path := "/v1/admin/invoices/" + strconv.FormatInt(id, 10)
	var rec api.InvoiceRecord
	r := b.getJSON(t, path, &rec)
	require.Regexp(t, `^MG-[0-9]{4}-[0-9]{6}$`, rec.Number)
	require.Equal(t, "EUR", rec.Currency)
	require.Equal(t, int64(9592), rec.SubtotalMinor)
	require.Equal(t, 1900, rec.TaxRateBP)
	require.Equal(t, int64(1822), rec.TaxMinor)
	require.Equal(t, int64(11414), rec.TotalMinor)
	require.Equal(t, invoice.StatusIssued, rec.Status)
	require.NotNil(t, rec.Buyer)
	require.Equal(t, "Acme AG", rec.Buyer.LegalName)
	require.Equal(t, testIssuer.Seller.LegalName, rec.Seller.LegalName)
	require.NotEmpty(t, rec.Lines)
	var sum int64
	for _, l := range rec.Lines {
		sum += l.AmountMinor
	}
	require.Equal(t, rec.SubtotalMinor, sum, "the lines add up to the subtotal")
	require.Contains(t, r.Body, "status_history")
	require.Empty(t, rec.StatusHistory)
	require.Contains(t, r.Body, "credit_notes")
	require.Empty(t, rec.CreditNotes)

	pdf := b.call(t, "GET", path+".pdf", adminToken, nil)
	require.Equal(t, http.StatusOK, pdf.Status, pdf.Raw)
	require.Equal(t, "application/pdf", pdf.Header.Get("Content-Type"))
	require.Equal(t, `attachment; filename="`+rec.Number+`.pdf"`, pdf.Header.Get("Content-Disposition"))
	require.True(t, strings.HasPrefix(pdf.Raw, "%PDF-"), "a PDF")
	again := b.call(t, "GET", path+".pdf", adminToken, nil)
	require.Equal(t, pdf.Raw, again.Raw, "the same invoice is the same bytes")

	html := b.call(t, "GET", path+".html", adminToken, nil)
	require.Equal(t, http.StatusOK, html.Status, html.Raw)
	require.Equal(t, "text/html; charset=utf-8", html.Header.Get("Content-Type"))
	require.Equal(t, "default-src 'none'; style-src 'unsafe-inline'", html.Header.Get("Content-Security-Policy"))
	require.Contains(t, html.Raw, document.FormatMinor(rec.TotalMinor, rec.Currency))
	require.Contains(t, html.Raw, "EUR 114.14")
	require.Contains(t, html.Raw, rec.Number)

	raw := b.call(t, "GET", path+".csv", adminToken, nil)
	require.Equal(t, http.StatusOK, raw.Status, raw.Raw)
	require.Equal(t, "text/csv; charset=utf-8", raw.Header.Get("Content-Type"))
	require.Equal(t, `attachment; filename="`+rec.Number+`.csv"`, raw.Header.Get("Content-Disposition"))
	rows, err := csv.NewReader(strings.NewReader(raw.Raw)).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 1+len(rec.Lines), "a header and one row per line")
	for i, l := range rec.Lines {
		require.Equal(t, rec.Number, rows[i+1][0])
		require.Equal(t, strconv.FormatInt(l.AmountMinor, 10), rows[i+1][12], "line %d", i+1)
	}

	require.Equal(t, http.StatusNotFound, b.call(t, "GET", "/v1/admin/invoices/999999999", adminToken, nil).Status)
	require.Equal(t, http.StatusNotFound, b.call(t, "GET", "/v1/admin/invoices/999999999.pdf", adminToken, nil).Status)
}

// Status changes follow the invoice's life (issued → paid | void | uncollectible,
// uncollectible → paid | void), each an audit row; a void issues the credit note of the
// whole invoice, once; a refused change writes nothing.
func TestInvoiceStatusAndVoid(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, invoices: true})
	f := b.invoiceFixture(t)
	url := func(org, suffix string) string {
		return "/v1/admin/invoices/" + strconv.FormatInt(f.invoices[org].ID, 10) + suffix
	}
	changes := func() int64 { return b.count(t, `SELECT count(*) FROM invoice_status_changes`) }
	notes := func() int64 { return b.count(t, `SELECT count(*) FROM credit_notes`) }

	r := b.call(t, "POST", url(f.acme, "/status"), adminToken, map[string]any{"status": "paid", "reason": "wire 2025-04-20"})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	var changed struct {
		Invoice    invoice.Invoice     `json:"invoice"`
		CreditNote *invoice.CreditNote `json:"credit_note"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &changed))
	require.Equal(t, invoice.StatusPaid, changed.Invoice.Status)
	require.Nil(t, changed.CreditNote)
	require.Equal(t, f.invoices[f.acme].TotalMinor, changed.Invoice.TotalMinor, "a status change moves no number")
	require.EqualValues(t, 1, changes())

	for _, body := range []map[string]any{{"status": "paid", "reason": "again"}, {"status": "uncollectible", "reason": "no"}} {
		r = b.call(t, "POST", url(f.acme, "/status"), adminToken, body)
		require.Equal(t, http.StatusConflict, r.Status, r.Raw)
		require.Equal(t, "invalid_transition", errCode(r))
	}
	r = b.call(t, "POST", url(f.acme, "/void"), adminToken, map[string]any{"reason": "paid is final"})
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "invalid_transition", errCode(r))
	require.EqualValues(t, 1, changes(), "a refused change writes nothing")
	require.Zero(t, notes())

	// beta is voided: its credit note credits the whole invoice.
	beta := f.invoices[f.beta]
	r = b.call(t, "POST", url(f.beta, "/void"), adminToken, map[string]any{"reason": "billed in error"})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	changed.CreditNote = nil
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &changed))
	require.Equal(t, invoice.StatusVoid, changed.Invoice.Status)
	note := changed.CreditNote
	require.NotNil(t, note)
	require.Regexp(t, `^MG-CN-[0-9]{4}-[0-9]{6}$`, note.Number)
	require.Equal(t, beta.ID, note.InvoiceID)
	require.Equal(t, beta.Number, note.InvoiceNumber)
	require.Equal(t, beta.TotalMinor, note.TotalMinor)
	require.Equal(t, beta.TaxMinor, note.TaxMinor)
	require.Equal(t, "billed in error", note.Reason)
	require.Equal(t, "admin", note.IssuedBy)
	require.EqualValues(t, 1, notes())

	r = b.call(t, "POST", url(f.beta, "/void"), adminToken, map[string]any{"reason": "twice"})
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "invalid_transition", errCode(r))
	require.EqualValues(t, 1, notes(), "a second void issues no second credit note")
	require.EqualValues(t, 2, changes())

	// The reissue replaces beta once, with the next number and the same amounts (nothing
	// changed in the log since).
	r = b.call(t, "POST", url(f.beta, "/reissue"), adminToken, map[string]any{"reason": "billed to the right entity"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	var re struct{ Invoice invoice.Invoice }
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &re))
	require.Equal(t, beta.ID, *re.Invoice.Replaces)
	require.NotEqual(t, beta.Number, re.Invoice.Number)
	require.Equal(t, beta.TotalMinor, re.Invoice.TotalMinor)
	require.Equal(t, "billed to the right entity", re.Invoice.Reason)
	r = b.call(t, "POST", url(f.beta, "/reissue"), adminToken, map[string]any{"reason": "again"})
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "already_reissued", errCode(r))
	r = b.call(t, "POST", url(f.acme, "/reissue"), adminToken, map[string]any{"reason": "not void"})
	require.Equal(t, http.StatusConflict, r.Status, r.Raw)
	require.Equal(t, "invalid_transition", errCode(r))

	var rec api.InvoiceRecord
	b.getJSON(t, url(f.beta, ""), &rec)
	require.Equal(t, invoice.StatusVoid, rec.Status)
	require.Len(t, rec.StatusHistory, 1)
	require.Equal(t, invoice.StatusChange{From: "issued", To: "void", Reason: "billed in error", ChangedBy: "admin",
		ChangedAt: rec.StatusHistory[0].ChangedAt}, rec.StatusHistory[0])
	require.Equal(t, []api.CreditNoteRef{{ID: note.ID, Number: note.Number}}, rec.CreditNotes)

	// gamma: uncollectible, then paid after all.
	for _, to := range []string{"uncollectible", "paid"} {
		r = b.call(t, "POST", url(f.gamma, "/status"), adminToken, map[string]any{"status": to, "reason": "dunning: " + to})
		require.Equal(t, http.StatusOK, r.Status, r.Raw)
	}
	require.EqualValues(t, 4, changes())

	// The credit notes API.
	type notePage struct {
		CreditNotes []invoice.CreditNote `json:"credit_notes"`
		NextAfter   *int64               `json:"next_after"`
	}
	var p notePage
	b.getJSON(t, "/v1/admin/credit-notes?org="+f.beta, &p)
	require.Len(t, p.CreditNotes, 1)
	require.Equal(t, note.Number, p.CreditNotes[0].Number)
	require.Empty(t, p.CreditNotes[0].Lines)
	b.getJSON(t, "/v1/admin/credit-notes?org="+f.acme, &p)
	require.Empty(t, p.CreditNotes)
	b.getJSON(t, "/v1/admin/credit-notes?limit=1", &p)
	require.Len(t, p.CreditNotes, 1)
	require.Equal(t, note.ID, *p.NextAfter)

	notePath := "/v1/admin/credit-notes/" + strconv.FormatInt(note.ID, 10)
	var got invoice.CreditNote
	b.getJSON(t, notePath, &got)
	require.Equal(t, note.Number, got.Number)
	require.Len(t, got.Lines, len(f.invoices[f.beta].Lines))
	pdf := b.call(t, "GET", notePath+".pdf", adminToken, nil)
	require.Equal(t, http.StatusOK, pdf.Status, pdf.Raw)
	require.True(t, strings.HasPrefix(pdf.Raw, "%PDF-"))
	require.Equal(t, `attachment; filename="`+note.Number+`.pdf"`, pdf.Header.Get("Content-Disposition"))
	require.Equal(t, pdf.Raw, b.call(t, "GET", notePath+".pdf", adminToken, nil).Raw)
	html := b.call(t, "GET", notePath+".html", adminToken, nil)
	require.Equal(t, http.StatusOK, html.Status, html.Raw)
	require.Contains(t, html.Raw, document.FormatMinor(note.TotalMinor, note.Currency))
	require.Contains(t, html.Raw, beta.Number, "the note names the invoice it credits")
	raw := b.call(t, "GET", notePath+".csv", adminToken, nil)
	rows, err := csv.NewReader(strings.NewReader(raw.Raw)).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 1+len(got.Lines))
	require.Equal(t, http.StatusNotFound, b.call(t, "GET", "/v1/admin/credit-notes/999999999", adminToken, nil).Status)

	// Bad input: 4xx with a code, nothing written.
	for _, tt := range []struct {
		name, path string
		body       any
		status     int
		code       string
	}{
		{"reason missing", url(f.gamma, "/void"), map[string]any{}, 400, "invalid_reason"},
		{"reason blank", url(f.gamma, "/void"), map[string]any{"reason": "  "}, 400, "invalid_reason"},
		{"reason with a control character", url(f.gamma, "/void"), map[string]any{"reason": "a\x07b"}, 400, "invalid_reason"},
		{"reason too long", url(f.gamma, "/void"), map[string]any{"reason": strings.Repeat("x", 1001)}, 400, "invalid_reason"},
		{"status void", url(f.gamma, "/status"), map[string]any{"status": "void", "reason": "x"}, 400, "invalid_status"},
		{"status unknown", url(f.gamma, "/status"), map[string]any{"status": "draft", "reason": "x"}, 400, "invalid_status"},
		{"status missing", url(f.gamma, "/status"), map[string]any{"reason": "x"}, 400, "invalid_status"},
		{"unknown field", url(f.gamma, "/void"), map[string]any{"reason": "x", "by": "me"}, 400, "unknown_field"},
		{"duplicate key", url(f.gamma, "/void"), `{"reason":"x","reason":"y"}`, 400, "duplicate_key"},
		{"not JSON", url(f.gamma, "/void"), `reason=x`, 400, "invalid_json"},
		{"bad id", "/v1/admin/invoices/x1/void", map[string]any{"reason": "x"}, 400, "invalid_id"},
		{"id with a suffix", url(f.gamma, ".pdf/void"), map[string]any{"reason": "x"}, 400, "invalid_id"},
		{"unknown invoice", "/v1/admin/invoices/999999999/void", map[string]any{"reason": "x"}, 404, "not_found"},
		{"void of a void", url(f.beta, "/void"), map[string]any{"reason": "x"}, 409, "invalid_transition"},
	} {
		r := b.call(t, "POST", tt.path, adminToken, tt.body)
		require.Equal(t, tt.status, r.Status, "%s: %s", tt.name, r.Raw)
		require.Equal(t, tt.code, errCode(r), tt.name)
	}
	require.EqualValues(t, 4, changes(), "bad input writes nothing")
	require.EqualValues(t, 1, notes())
}

// Billing details: written and read through the admin API; bad details, an account that
// is not an org and a currency that is not the plan's are refused with a code, and
// nothing is written.
func TestBillingDetails(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, invoices: true})
	org := b.orgRow(t, b.id("org"))
	team := b.id("team")
	_, err := b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, parent, org) VALUES ($1, 'team', $2, $2)`, team, org)
	require.NoError(t, err)
	path := "/v1/admin/accounts/" + org + "/billing"

	r := b.call(t, "GET", path, adminToken, nil)
	require.Equal(t, http.StatusNotFound, r.Status, "none yet: %s", r.Raw)
	details := map[string]any{"legal_name": "Org GmbH", "address": []string{"Ring 1"}, "city": "Köln", "country": "DE",
		"email": "billing@org.example", "tax_rate_bp": 700}
	r = b.call(t, "PUT", path, adminToken, details)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	var stored invoice.BillingDetails
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &stored))
	require.Equal(t, org, stored.Org)
	require.Equal(t, "admin", stored.UpdatedBy)
	require.Equal(t, 700, *stored.TaxRateBP)
	var read invoice.BillingDetails
	b.getJSON(t, path, &read)
	require.Equal(t, stored, read)

	rows := func() int64 { return b.count(t, `SELECT count(*) FROM billing_details`) }
	with := func(k string, v any) map[string]any {
		d := map[string]any{}
		for k, v := range details {
			d[k] = v
		}
		if v == nil {
			delete(d, k)
		} else {
			d[k] = v
		}
		return d
	}
	for _, tt := range []struct {
		name, path string
		body       any
		status     int
		code       string
	}{
		{"tax rate over 100 %", path, with("tax_rate_bp", 10001), 400, "invalid_billing_details"},
		{"tax rate negative", path, with("tax_rate_bp", -1), 400, "invalid_billing_details"},
		{"tax rate a fraction", path, with("tax_rate_bp", 19.5), 400, "invalid_field"},
		{"no legal name", path, with("legal_name", nil), 400, "invalid_billing_details"},
		{"blank legal name", path, with("legal_name", " "), 400, "invalid_billing_details"},
		{"country not a code", path, with("country", "Germany"), 400, "invalid_billing_details"},
		{"currency not a code", path, with("currency", "euro"), 400, "invalid_billing_details"},
		{"five address lines", path, with("address", []string{"1", "2", "3", "4", "5"}), 400, "invalid_billing_details"},
		{"control character", path, with("city", "Köln\n"), 400, "invalid_billing_details"},
		{"org in the body", path, with("org", org), 400, "unknown_field"},
		{"duplicate key", path, `{"legal_name":"a","legal_name":"b","country":"DE"}`, 400, "duplicate_key"},
		{"bad account id", "/v1/admin/accounts/-x/billing", details, 400, "invalid_account"},
		{"unknown account", "/v1/admin/accounts/" + b.id("nobody") + "/billing", details, 404, "not_found"},
		{"not an org", "/v1/admin/accounts/" + team + "/billing", details, 409, "not_an_org"},
		{"currency mismatch", path, with("currency", "USD"), 409, "currency_mismatch"},
	} {
		r := b.call(t, "PUT", tt.path, adminToken, tt.body)
		require.Equal(t, tt.status, r.Status, "%s: %s", tt.name, r.Raw)
		require.Equal(t, tt.code, errCode(r), tt.name)
	}
	require.EqualValues(t, 1, rows(), "refused details write nothing")
	b.getJSON(t, path, &read)
	require.Equal(t, stored, read, "the stored details are unchanged")

	r = b.call(t, "PUT", path, adminToken, with("currency", "EUR"))
	require.Equal(t, http.StatusOK, r.Status, "the plan's currency: %s", r.Raw)
	require.Equal(t, http.StatusNotFound, b.call(t, "GET", "/v1/admin/accounts/"+team+"/billing", adminToken, nil).Status)
}

// Every query parameter and path id is checked: 400 with the parameter's code.
func TestInvoicesBadQueries(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, invoices: true})
	for path, code := range map[string]string{
		"/v1/admin/invoices?limit=0":           "invalid_limit",
		"/v1/admin/invoices?limit=501":         "invalid_limit",
		"/v1/admin/invoices?limit=ten":         "invalid_limit",
		"/v1/admin/invoices?after=-1":          "invalid_after",
		"/v1/admin/invoices?after=x":           "invalid_after",
		"/v1/admin/invoices?status=draft":      "invalid_status",
		"/v1/admin/invoices?period=2025-13":    "invalid_period",
		"/v1/admin/invoices?period=2025-03-01": "invalid_period",
		"/v1/admin/invoices?period=March":      "invalid_period",
		"/v1/admin/invoices?org=-acme":         "invalid_org",
		"/v1/admin/invoices?org=a%20b":         "invalid_org",
		"/v1/admin/invoices/abc":               "invalid_id",
		"/v1/admin/invoices/0":                 "invalid_id",
		"/v1/admin/invoices/012":               "invalid_id",
		"/v1/admin/invoices/1.txt":             "invalid_id",
		"/v1/admin/invoices/1.pdf.pdf":         "invalid_id",
		"/v1/admin/invoices/.pdf":              "invalid_id",
		"/v1/admin/credit-notes?limit=1000":    "invalid_limit",
		"/v1/admin/credit-notes?after=1.5":     "invalid_after",
		"/v1/admin/credit-notes?org=%2A":       "invalid_org",
		"/v1/admin/credit-notes/x.csv":         "invalid_id",
		"/v1/admin/accounts/-x/billing":        "invalid_account",
	} {
		r := b.call(t, "GET", path, adminToken, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", path, r.Raw)
		require.Equal(t, code, errCode(r), path)
	}
	var empty struct {
		Invoices  []invoice.Invoice `json:"invoices"`
		NextAfter *int64            `json:"next_after"`
	}
	b.getJSON(t, "/v1/admin/invoices?org=acme&period=2025-03&status=void&after=0&limit=500", &empty)
	require.NotNil(t, empty.Invoices, "an empty page is an empty list")
	require.Empty(t, empty.Invoices)
}

// The invoices API takes the admin token alone, and answers 503 where no store is wired.
func TestInvoicesAuthAndUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, invoices: true})
	for _, rt := range []struct{ method, path string }{
		{"GET", "/v1/admin/invoices"}, {"GET", "/v1/admin/invoices/1"}, {"GET", "/v1/admin/invoices/1.pdf"},
		{"POST", "/v1/admin/invoices/1/status"}, {"POST", "/v1/admin/invoices/1/void"}, {"POST", "/v1/admin/invoices/1/reissue"},
		{"GET", "/v1/admin/credit-notes"}, {"GET", "/v1/admin/credit-notes/1.html"},
		{"PUT", "/v1/admin/accounts/acme/billing"}, {"GET", "/v1/admin/accounts/acme/billing"},
	} {
		r := b.call(t, rt.method, rt.path, "", nil)
		require.Equal(t, http.StatusUnauthorized, r.Status, "%s %s", rt.method, rt.path)
		require.Equal(t, "unauthorized", errCode(r))
		r = b.call(t, rt.method, rt.path, serviceToken, nil)
		require.Equal(t, http.StatusForbidden, r.Status, "%s %s", rt.method, rt.path)
	}
	none := setup(t, setupOpts{bare: true})
	r := none.call(t, "GET", "/v1/admin/invoices", adminToken, nil)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Raw)
	require.Equal(t, "unavailable", errCode(r))
	require.True(t, bytes.Contains([]byte(r.Raw), []byte("invoices are unavailable")))
}
