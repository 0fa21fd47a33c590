package console_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/staff"
)

// billedMonth is the month the billing tests invoice: long past, so that their org
// (created in 2020) is due.
var billedMonth = time.Date(2025, time.March, 1, 0, 0, 0, 0, time.UTC)

// invoiced makes an org on plan pro (with billing details named legalName, 19 % tax, when
// legalName is not empty), closes billedMonth as reconcile's close would, and returns the
// org's invoice: the base fee alone.
func (b *testBundle) invoiced(t *testing.T, legalName string) invoice.Invoice {
	t.Helper()
	org := b.id("acme")
	_, err := b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, org, plan, created_at) VALUES ($1, 'org', $1, 'pro', '2020-01-01')`, org)
	require.NoError(t, err)
	if legalName != "" {
		rate := 1900
		_, err := invoice.PutBillingDetails(b.ctx, b.pool, invoice.BillingDetails{Org: org, Party: document.Party{
			LegalName: legalName, Address: []string{"Hauptstraße 5"}, City: "München", PostalCode: "80331", Country: "DE"},
			Currency: "EUR", TaxRateBP: &rate, UpdatedBy: "test"}, billedMonth)
		require.NoError(t, err)
	}
	res, err := invoice.Close(b.ctx, b.pool, billedMonth, invoice.Options{
		Clock: period.Fixed(billedMonth.AddDate(0, 1, 9)), Issuer: testIssuer, By: "console test"})
	require.NoError(t, err)
	for _, inv := range res.Invoices {
		if inv.Org == org {
			require.NotEmpty(t, inv.Number)
			return inv
		}
	}
	t.Fatalf("no invoice of %s in %+v", org, res)
	return invoice.Invoice{}
}

// adminCall calls the admin API with the admin token, wanting a 2xx.
func (b *testBundle) adminCall(t *testing.T, method, path string, body any) {
	t.Helper()
	status, out := b.api(t, method, path, adminToken, body)
	require.Less(t, status, 300, "%s %s: %s", method, path, out)
}

// TestInvoicePages: the list and the page of an invoice show its number and total, its
// customer's free-text name escaped, and its PDF downloads; the plans show their prices.
func TestInvoicePages(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const evil = `<script>alert(1)</script>`
	inv := b.invoiced(t, evil)
	total := document.FormatMinor(inv.TotalMinor, inv.Currency)
	require.Equal(t, "EUR 58.31", total, "the base fee, 49.00, and 19 % tax")
	_, token := b.member(t, staff.Viewer)
	br := b.signedIn(t, token)
	id := strconv.FormatInt(inv.ID, 10)

	r := br.get("/console/invoices")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, inv.Number)
	require.Contains(t, r.body, total)
	r = br.get("/console/invoices?" + url.Values{"org": {inv.Org}, "period": {"2025-03"}, "status": {"issued"}}.Encode())
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, inv.Number)
	for _, q := range []string{"status=void", "period=2025-04", "org=" + b.id("nobody")} {
		r = br.get("/console/invoices?" + q)
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.NotContains(t, r.body, inv.Number, q)
	}
	r = br.get("/console/invoices?period=March")
	require.Equal(t, http.StatusBadRequest, r.status, "the API's answer to a bad filter")
	require.Contains(t, r.body, "period must be a month")

	r = br.get("/console/invoices/" + id)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, inv.Number)
	require.Contains(t, r.body, total)
	require.Contains(t, r.body, "19 %")
	require.Contains(t, r.body, testIssuer.Seller.LegalName)
	require.Contains(t, r.body, "&lt;script&gt;alert(1)&lt;/script&gt;", "the buyer's name, escaped")
	require.NotContains(t, r.body, evil)
	require.Contains(t, r.body, `href="/console/invoices/`+id+`/pdf"`)
	require.NotContains(t, r.body, `/void"`, "a viewer is offered no void")
	require.NotContains(t, r.body, "<script")

	r = br.get("/console/invoices/" + id + "/pdf")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Equal(t, "application/pdf", r.header.Get("Content-Type"))
	require.Equal(t, `attachment; filename="`+inv.Number+`.pdf"`, r.header.Get("Content-Disposition"))
	require.True(t, strings.HasPrefix(r.body, "%PDF"), "a PDF")
	r = br.get("/console/invoices/999999999/pdf")
	require.Equal(t, http.StatusNotFound, r.status)
	require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"), "an error page, not a PDF")
	require.Equal(t, http.StatusNotFound, br.get("/console/invoices/x1").status)
	require.Equal(t, http.StatusNotFound, br.get("/console/credit-notes/999999999").status)

	r = br.get("/console/plans")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, `href="/console/plans/pro"`)
	require.Contains(t, r.body, "EUR 49.00")
	r = br.get("/console/plans/pro")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "5\u202f000\u202f000 per month", "the requests quota")
	require.Contains(t, r.body, "Version 1")
	require.Contains(t, r.body, "EUR 0.02 per 1\u202f000", "the tokens' first tier")
	require.Equal(t, http.StatusNotFound, br.get("/console/plans/nope").status)

	// Each price version prices the months from its start to the earliest start of a
	// later version's: v1 to 2030-02, v3 from 2030-03 on, and v2 (from 2030-06) never.
	planID := b.id("plan")
	b.adminCall(t, http.MethodPost, "/v1/admin/plans", map[string]any{"id": planID, "rank": 50,
		"price": map[string]any{"currency": "EUR", "base_fee_minor": 1000}})
	for _, v := range []struct {
		fee  int
		from string
	}{{2000, "2030-06"}, {3000, "2030-03"}} {
		b.adminCall(t, http.MethodPut, "/v1/admin/plans/"+planID, map[string]any{"rank": 50,
			"price": map[string]any{"currency": "EUR", "base_fee_minor": v.fee, "effective_period": v.from}})
	}
	r = br.get("/console/plans/" + planID)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Regexp(t, `(?s)Version 1 \(prices this month\).*from the start to 2030-02.*EUR 10.00`, r.body)
	require.Regexp(t, `(?s)Version 2</h3>.*never.*EUR 20.00`, r.body)
	require.Regexp(t, `(?s)Version 3</h3>.*from 2030-03, with no end yet.*EUR 30.00`, r.body)

	r = br.get("/console/credit-notes")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "No credit notes")
}

// TestVoidAndReissueInTheConsole: finance voids an invoice after its confirmation page,
// which issues its credit note (its page and PDF follow), audited as the member; support
// may not; a void invoice is reissued once, and the API's refusals show as they are.
func TestVoidAndReissueInTheConsole(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	inv := b.invoiced(t, "Acme AG")
	id := strconv.FormatInt(inv.ID, 10)
	total := document.FormatMinor(inv.TotalMinor, inv.Currency)
	fin, finToken := b.member(t, staff.Finance)
	_, supToken := b.member(t, staff.Support)
	finance, support := b.signedIn(t, finToken), b.signedIn(t, supToken)
	count := func(sql string, args ...any) int64 {
		var n int64
		require.NoError(t, b.pool.QueryRow(b.ctx, sql, args...).Scan(&n))
		return n
	}
	status := func() string {
		var s string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status FROM invoices WHERE id = $1`, inv.ID).Scan(&s))
		return s
	}
	voidRoute := "/v1/admin/invoices/{id}/void"
	audited := func(actor string) int64 {
		return count(`SELECT count(*) FROM audit_log WHERE method = 'POST' AND route = $1 AND path = $2 AND actor = $3 AND status = 200`,
			voidRoute, "/v1/admin/invoices/"+id+"/void", actor)
	}

	// Support reads the invoice but may not void it.
	r := support.get("/console/invoices/" + id)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.NotContains(t, r.body, "/console/invoices/"+id+"/void")
	require.Equal(t, http.StatusForbidden, support.get("/console/invoices/"+id+"/void").status)
	r = support.post("/console/invoices/"+id+"/void", url.Values{"reason": {"support tries"}})
	require.Equal(t, http.StatusForbidden, r.status, r.body)
	require.Equal(t, invoice.StatusIssued, status())
	require.Zero(t, count(`SELECT count(*) FROM credit_notes`))
	require.Zero(t, count(`SELECT count(*) FROM audit_log WHERE route = $1`, voidRoute), "a refused write is no API call")

	// Finance: the invoice offers the void, whose page says what it does.
	r = finance.get("/console/invoices/" + id)
	require.Contains(t, r.body, `href="/console/invoices/`+id+`/void"`)
	require.NotContains(t, r.body, "/reissue", "only a void invoice is reissued")
	r = finance.get("/console/invoices/" + id + "/void")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, inv.Number)
	require.Contains(t, r.body, total)
	require.Contains(t, r.body, "credit note")
	require.Contains(t, r.body, `name="reason"`)
	require.Contains(t, r.body, `class="danger"`)

	r = finance.post("/console/invoices/"+id+"/void", url.Values{"reason": {"  "}})
	require.Equal(t, http.StatusBadRequest, r.status, "the API's refusal: %s", r.body)
	require.Contains(t, r.body, "a reason is required")
	require.Equal(t, invoice.StatusIssued, status())

	r = finance.post("/console/invoices/"+id+"/void", url.Values{"reason": {"billed in error"}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.Equal(t, "/console/invoices/"+id, r.location)
	require.Equal(t, invoice.StatusVoid, status())
	require.EqualValues(t, 1, audited(fin.ID), "the void is audited as the finance member")
	require.EqualValues(t, 1, count(`SELECT count(*) FROM invoice_status_changes WHERE invoice_id = $1 AND changed_by = $2`, inv.ID, fin.ID),
		"the status trail names the finance member")
	require.EqualValues(t, 1, count(`SELECT count(*) FROM credit_notes WHERE invoice_id = $1 AND issued_by = $2`, inv.ID, fin.ID),
		"the credit note too")
	var noteID int64
	var noteNumber string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id, number FROM credit_notes WHERE invoice_id = $1`, inv.ID).Scan(&noteID, &noteNumber))
	note := strconv.FormatInt(noteID, 10)

	r = finance.get("/console/invoices/" + id)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "billed in error")
	require.Contains(t, r.body, `href="/console/credit-notes/`+note+`"`)
	require.Contains(t, r.body, `href="/console/invoices/`+id+`/reissue"`)
	require.NotContains(t, r.body, "/console/invoices/"+id+"/void")

	r = finance.get("/console/credit-notes/" + note)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, noteNumber)
	require.Contains(t, r.body, `href="/console/invoices/`+id+`"`)
	require.Contains(t, r.body, inv.Number)
	require.Contains(t, r.body, total)
	r = finance.get("/console/credit-notes?org=" + inv.Org)
	require.Contains(t, r.body, noteNumber)
	r = finance.get("/console/credit-notes/" + note + "/pdf")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Equal(t, "application/pdf", r.header.Get("Content-Type"))
	require.Equal(t, `attachment; filename="`+noteNumber+`.pdf"`, r.header.Get("Content-Disposition"))
	require.True(t, strings.HasPrefix(r.body, "%PDF"))

	// A second void is the API's 409, with its message; nothing changes.
	finance.get("/console/invoices/" + id)
	r = finance.post("/console/invoices/"+id+"/void", url.Values{"reason": {"twice"}})
	require.Equal(t, http.StatusConflict, r.status, r.body)
	require.Contains(t, r.body, "paid and void are final")
	require.EqualValues(t, 1, count(`SELECT count(*) FROM credit_notes`))
	require.Equal(t, http.StatusConflict, finance.get("/console/invoices/"+id+"/void").status)

	// Reissue: confirmed, issued, shown; once.
	r = finance.get("/console/invoices/" + id + "/reissue")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, inv.Number)
	require.Contains(t, r.body, "next invoice number")
	r = support.post("/console/invoices/"+id+"/reissue", url.Values{"reason": {"support tries"}})
	require.Equal(t, http.StatusForbidden, r.status, r.body)
	r = finance.post("/console/invoices/"+id+"/reissue", url.Values{"reason": {"billed to the right entity"}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	var newID int64
	var newNumber string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id, number FROM invoices WHERE replaces = $1`, inv.ID).Scan(&newID, &newNumber))
	require.Equal(t, "/console/invoices/"+strconv.FormatInt(newID, 10), r.location)
	r = finance.get(r.location)
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, newNumber)
	require.Contains(t, r.body, `href="/console/invoices/`+id+`"`, "it names the invoice it replaces")
	require.Contains(t, r.body, "billed to the right entity")
	r = finance.get("/console/invoices/" + id)
	require.Contains(t, r.body, newNumber, "the void invoice names its replacement")
	require.NotContains(t, r.body, "/reissue\"")

	r = finance.post("/console/invoices/"+id+"/reissue", url.Values{"reason": {"again"}})
	require.Equal(t, http.StatusConflict, r.status, r.body)
	require.Contains(t, r.body, "already reissued")
	require.EqualValues(t, 1, count(`SELECT count(*) FROM invoices WHERE replaces = $1`, inv.ID))
	require.Equal(t, http.StatusConflict, finance.get("/console/invoices/"+id+"/reissue").status)
}
