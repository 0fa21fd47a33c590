package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/policy"
)

// billingPages are the pages of plans, invoices and credit notes. They read through the
// admin API (GET /v1/admin/plans, /invoices, /credit-notes) as the signed-in member, and
// void and reissue through it, so that its checks and audit log apply.
func (c *Console) billingPages() map[string]page {
	return map[string]page{
		"GET /console/plans":                  c.plans,
		"GET /console/plans/{id}":             c.plan,
		"GET /console/invoices":               c.invoices,
		"GET /console/invoices/{id}":          c.invoice,
		"GET /console/invoices/{id}/pdf":      c.documentPDF("/v1/admin/invoices/", "invoice"),
		"GET /console/invoices/{id}/void":     c.confirmVoid,
		"POST /console/invoices/{id}/void":    c.voidInvoice,
		"GET /console/invoices/{id}/reissue":  c.confirmReissue,
		"POST /console/invoices/{id}/reissue": c.reissueInvoice,
		"GET /console/credit-notes":           c.creditNotes,
		"GET /console/credit-notes/{id}":      c.creditNote,
		"GET /console/credit-notes/{id}/pdf":  c.documentPDF("/v1/admin/credit-notes/", "credit note"),
	}
}

// plan is a plan as GET /v1/admin/plans gives it, with what its pages show of it.
type plan struct {
	ID                  string                           `json:"id"`
	Rank                int                              `json:"rank"`
	Limits              map[policy.Unit]policy.Limit     `json:"limits"`
	Concurrency         int                              `json:"concurrency"`
	Priority            int                              `json:"priority"`
	Prices              []priceVersion                   `json:"prices"`
	Grants              map[policy.Unit]policy.PlanGrant `json:"grants"`
	Shadow              bool                             `json:"shadow"`
	CurrentPriceVersion int                              `json:"current_price_version"`

	LimitRows []planLimit // the limits, in the units' order
	GrantRows []planGrant // the grants, in the units' order
}

// planLimit is a plan's limit of one unit.
type planLimit struct {
	Unit        policy.Unit
	Rate, Quota string
}

// planGrant is a plan's monthly grant of one unit.
type planGrant struct {
	Unit policy.Unit
	policy.PlanGrant
}

// priceVersion is a version of a plan's price, and the months it prices.
type priceVersion struct {
	Version         int                  `json:"version"`
	EffectivePeriod string               `json:"effective_period"` // YYYY-MM; empty: from the start
	Currency        string               `json:"currency"`
	BaseFeeMinor    int64                `json:"base_fee_minor"`
	Units           map[string]unitPrice `json:"units"`
	CreatedAt       time.Time            `json:"created_at"`

	From, To string // the first and last month it prices ("" for either: no bound)
	Never    bool   // a higher version starting no later prices its months
	Current  bool   // it prices this month
	UnitRows []unitPriceRow
}

type unitPrice struct {
	Included int64  `json:"included"`
	Tiers    []tier `json:"tiers"`
}

type tier struct {
	From       int64  `json:"from"`
	UpTo       *int64 `json:"up_to"` // nil: no end
	PriceMinor int64  `json:"price_minor"`
	PerUnits   int64  `json:"per_units"`
}

// unitPriceRow is a price version's price of one unit.
type unitPriceRow struct {
	Unit string
	unitPrice
}

// prepare fills what the pages show of p, in the units' order.
func (p *plan) prepare() {
	for _, u := range policy.Units {
		if l, ok := p.Limits[u]; ok {
			p.LimitRows = append(p.LimitRows, planLimit{Unit: u, Rate: describeRate(l), Quota: describeQuota(l)})
		}
		if g, ok := p.Grants[u]; ok {
			p.GrantRows = append(p.GrantRows, planGrant{Unit: u, PlanGrant: g})
		}
	}
	for i := range p.Prices {
		v := &p.Prices[i]
		v.From, v.Current = v.EffectivePeriod, v.Version == p.CurrentPriceVersion
		// A version prices the months from its start to the earliest start of a higher
		// version (invoice.VersionAt): none when that one starts no later ("" is the start).
		next, later := "", false
		for _, w := range p.Prices {
			if w.Version > v.Version && (!later || w.EffectivePeriod < next) {
				next, later = w.EffectivePeriod, true
			}
		}
		if later {
			v.Never, v.To = next <= v.EffectivePeriod, monthBefore(next)
		}
		for _, u := range policy.Units {
			if up, ok := v.Units[string(u)]; ok {
				v.UnitRows = append(v.UnitRows, unitPriceRow{Unit: string(u), unitPrice: up})
			}
		}
	}
}

// monthBefore is the month before month (YYYY-MM), or month when it does not parse.
func monthBefore(month string) string {
	t, err := time.Parse("2006-01", month)
	if err != nil {
		return month
	}
	return t.AddDate(0, -1, 0).Format("2006-01")
}

// describeRate says a limit's rate: "100/s, burst 300", "1 000 per 60 s", or "".
func describeRate(l policy.Limit) string {
	switch {
	case l.Algorithm == policy.SlidingWindow && l.Limit > 0:
		return fmt.Sprintf("%s per %d s (sliding window)", formatNum(l.Limit), l.WindowS)
	case l.Burst > 0:
		s := fmt.Sprintf("%s/s, burst %s", strconv.FormatFloat(l.RatePerS, 'f', -1, 64), formatNum(l.Burst))
		if l.Ceiling > 0 {
			s += ", ceiling " + formatNum(l.Ceiling)
		}
		return s
	}
	return ""
}

// describeQuota says a limit's quota: "5 000 000 per month", "uncapped" (-1), or "".
func describeQuota(l policy.Limit) string {
	switch {
	case l.Quota == nil:
		return ""
	case *l.Quota < 0:
		return "uncapped"
	}
	per := string(l.QuotaPeriod)
	if per == "" {
		per = "month"
	}
	return formatNum(*l.Quota) + " per " + per
}

func (c *Console) plans(w http.ResponseWriter, r *http.Request, v *view) {
	var list struct {
		Plans []plan `json:"plans"`
	}
	if err := v.call(r.Context(), http.MethodGet, "/v1/admin/plans", nil, &list); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	for i := range list.Plans {
		list.Plans[i].prepare()
	}
	v.Title, v.Nav = "Plans and prices", "plans"
	c.render(w, r, v, http.StatusOK, "plans", list.Plans)
}

func (c *Console) plan(w http.ResponseWriter, r *http.Request, v *view) {
	id := r.PathValue("id")
	if !policy.ValidID(id) {
		c.fail(w, r, v, http.StatusNotFound, "There is no such plan.")
		return
	}
	var p plan
	if err := v.call(r.Context(), http.MethodGet, "/v1/admin/plans/"+url.PathEscape(id), nil, &p); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	p.prepare()
	v.Title, v.Nav = "Plan "+p.ID, "plans"
	c.render(w, r, v, http.StatusOK, "plan", p)
}

// invoiceRow is an invoice of the list.
type invoiceRow struct {
	invoice.Invoice
	Month string // its period, YYYY-MM
}

// invoiceFilter is the list of invoices' filters, as the form and the API take them.
type invoiceFilter struct {
	Org, Period, Status string
}

func (f invoiceFilter) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"org": f.Org, "period": f.Period, "status": f.Status} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

func (c *Console) invoices(w http.ResponseWriter, r *http.Request, v *view) {
	in := r.URL.Query()
	f := invoiceFilter{Org: strings.TrimSpace(in.Get("org")), Period: strings.TrimSpace(in.Get("period")), Status: in.Get("status")}
	q := f.query()
	q.Set("limit", strconv.Itoa(pageSize))
	if after := in.Get("after"); after != "" {
		q.Set("after", after)
	}
	var list struct {
		Invoices  []invoice.Invoice `json:"invoices"`
		NextAfter *int64            `json:"next_after"`
	}
	if err := v.call(r.Context(), http.MethodGet, "/v1/admin/invoices?"+q.Encode(), nil, &list); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	rows := make([]invoiceRow, len(list.Invoices))
	for i, inv := range list.Invoices {
		rows[i] = invoiceRow{Invoice: inv, Month: monthOf(inv.Period)}
	}
	var next string
	if list.NextAfter != nil {
		nq := f.query()
		nq.Set("after", strconv.FormatInt(*list.NextAfter, 10))
		next = "/console/invoices?" + nq.Encode()
	}
	v.Title, v.Nav = "Invoices", "invoices"
	c.render(w, r, v, http.StatusOK, "invoices", struct {
		Filter   invoiceFilter
		Statuses []string
		Invoices []invoiceRow
		Next     string
	}{f, []string{invoice.StatusIssued, invoice.StatusPaid, invoice.StatusVoid, invoice.StatusUncollectible}, rows, next})
}

// monthOf is the month (YYYY-MM) of a period's first day (YYYY-MM-DD).
func monthOf(day string) string {
	if len(day) >= 7 {
		return day[:7]
	}
	return day
}

// docID reads the path's document id: a whole number from 1, as the admin API takes it.
func docID(r *http.Request) (string, bool) {
	id := r.PathValue("id")
	n, err := strconv.ParseInt(id, 10, 64)
	return id, err == nil && n >= 1 && strconv.FormatInt(n, 10) == id
}

// invoicePage is the data of an invoice's page and of its confirmations.
type invoicePage struct {
	api.InvoiceRecord
	Month               string
	TaxRate             string
	Seller, Buyer       []string             // the parties' lines
	Notes               []invoice.CreditNote // its credit notes, without their lines
	Credited            int64                // what its credit notes credit already (the total of theirs)
	Uncredited          int64                // what a void would credit: the total less Credited
	ReplacedBy          *invoice.Invoice     // its reissue, when voided and reissued
	CanVoid, CanReissue bool                 // its status and the viewer's role allow it
}

// readInvoice reads invoice id with its credit notes and its reissue, as v; a false ok when
// it answered an error page.
func (c *Console) readInvoice(w http.ResponseWriter, r *http.Request, v *view) (invoicePage, bool) {
	var p invoicePage
	id, ok := docID(r)
	if !ok {
		c.fail(w, r, v, http.StatusNotFound, "There is no such invoice.")
		return p, false
	}
	ctx := r.Context()
	if err := v.call(ctx, http.MethodGet, "/v1/admin/invoices/"+id, nil, &p.InvoiceRecord); err != nil {
		c.apiFailed(w, r, v, err)
		return p, false
	}
	for _, ref := range p.CreditNotes {
		var n invoice.CreditNote
		if err := v.call(ctx, http.MethodGet, "/v1/admin/credit-notes/"+strconv.FormatInt(ref.ID, 10), nil, &n); err != nil {
			c.apiFailed(w, r, v, err)
			return p, false
		}
		n.Lines = nil
		p.Notes = append(p.Notes, n)
		p.Credited += n.TotalMinor
	}
	p.Uncredited = p.TotalMinor - p.Credited
	if p.Status == invoice.StatusVoid {
		// Its reissue is an invoice of the same org and month that names it.
		q := url.Values{"org": {p.Org}, "period": {monthOf(p.Period)}, "limit": {"500"}}
		var list struct {
			Invoices []invoice.Invoice `json:"invoices"`
		}
		if err := v.call(ctx, http.MethodGet, "/v1/admin/invoices?"+q.Encode(), nil, &list); err != nil {
			c.apiFailed(w, r, v, err)
			return p, false
		}
		for _, inv := range list.Invoices {
			if inv.Replaces != nil && *inv.Replaces == p.ID {
				p.ReplacedBy = &inv
				break
			}
		}
	}
	p.Month, p.TaxRate = monthOf(p.Period), taxRate(p.TaxRateBP)
	p.Seller, p.Buyer = partyLines(p.Invoice.Seller), partyLines(p.Invoice.Buyer)
	p.CanVoid = v.Can("POST /v1/admin/invoices/{id}/void") &&
		slices.Contains([]string{invoice.StatusIssued, invoice.StatusUncollectible}, p.Status)
	p.CanReissue = v.Can("POST /v1/admin/invoices/{id}/reissue") && p.Status == invoice.StatusVoid && p.ReplacedBy == nil
	return p, true
}

// Name is how the pages name an invoice: its number, or its id when issued before numbering.
func (p invoicePage) Name() string {
	if p.Number != "" {
		return p.Number
	}
	return "#" + strconv.FormatInt(p.ID, 10)
}

// taxRate writes a rate in basis points as a percentage: 1900 is "19 %", 1950 "19.5 %".
func taxRate(bp int) string {
	return strconv.FormatFloat(float64(bp)/100, 'f', -1, 64) + " %"
}

// partyLines are a party's name and address as the lines of a letter; none for nil.
func partyLines(p *document.Party) []string {
	if p == nil {
		return nil
	}
	out := append([]string{p.LegalName}, p.Address...)
	city := strings.TrimSpace(p.PostalCode + " " + p.City)
	if p.Region != "" {
		city = strings.TrimSpace(city + ", " + p.Region)
	}
	for _, s := range []string{city, p.Country, p.Email} {
		if s != "" {
			out = append(out, s)
		}
	}
	if p.TaxID != "" {
		out = append(out, "Tax id "+p.TaxID)
	}
	return out
}

func (c *Console) invoice(w http.ResponseWriter, r *http.Request, v *view) {
	p, ok := c.readInvoice(w, r, v)
	if !ok {
		return
	}
	v.Title, v.Nav = "Invoice "+p.Name(), "invoices"
	c.render(w, r, v, http.StatusOK, "invoice", p)
}

// confirmVoid states what voiding the invoice does and asks for the reason.
func (c *Console) confirmVoid(w http.ResponseWriter, r *http.Request, v *view) {
	p, ok := c.readInvoice(w, r, v)
	if !ok {
		return
	}
	v.Title, v.Nav = "Void invoice "+p.Name(), "invoices"
	if !v.Can("POST /v1/admin/invoices/{id}/void") {
		c.fail(w, r, v, http.StatusForbidden, fmt.Sprintf("Your role (%s) may not void invoices.", v.Me().Role))
		return
	}
	if !p.CanVoid {
		c.fail(w, r, v, http.StatusConflict, fmt.Sprintf("Invoice %s is %s: only an issued or uncollectible invoice can be voided.", p.Name(), p.Status))
		return
	}
	c.render(w, r, v, http.StatusOK, "invoice_void", p)
}

// confirmReissue states what reissuing the invoice does and asks for the reason.
func (c *Console) confirmReissue(w http.ResponseWriter, r *http.Request, v *view) {
	p, ok := c.readInvoice(w, r, v)
	if !ok {
		return
	}
	v.Title, v.Nav = "Reissue invoice "+p.Name(), "invoices"
	switch {
	case !v.Can("POST /v1/admin/invoices/{id}/reissue"):
		c.fail(w, r, v, http.StatusForbidden, fmt.Sprintf("Your role (%s) may not reissue invoices.", v.Me().Role))
	case p.ReplacedBy != nil:
		c.fail(w, r, v, http.StatusConflict, fmt.Sprintf("Invoice %s is reissued already, as %s.", p.Name(), invoiceName(*p.ReplacedBy)))
	case !p.CanReissue:
		c.fail(w, r, v, http.StatusConflict, fmt.Sprintf("Invoice %s is %s: only a void invoice can be reissued. Void it first.", p.Name(), p.Status))
	default:
		c.render(w, r, v, http.StatusOK, "invoice_reissue", p)
	}
}

func invoiceName(inv invoice.Invoice) string {
	return invoicePage{InvoiceRecord: api.InvoiceRecord{Invoice: inv}}.Name()
}

// voidInvoice voids the invoice, which issues its credit note, and shows the invoice.
func (c *Console) voidInvoice(w http.ResponseWriter, r *http.Request, v *view) {
	id, ok := docID(r)
	if !ok {
		c.fail(w, r, v, http.StatusNotFound, "There is no such invoice.")
		return
	}
	body := map[string]string{"reason": r.PostFormValue("reason")}
	if err := v.call(r.Context(), http.MethodPost, "/v1/admin/invoices/"+id+"/void", body, nil); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/console/invoices/"+id)
}

// reissueInvoice issues the replacement of a void invoice and shows it.
func (c *Console) reissueInvoice(w http.ResponseWriter, r *http.Request, v *view) {
	id, ok := docID(r)
	if !ok {
		c.fail(w, r, v, http.StatusNotFound, "There is no such invoice.")
		return
	}
	var out struct {
		Invoice invoice.Invoice `json:"invoice"`
	}
	body := map[string]string{"reason": r.PostFormValue("reason")}
	if err := v.call(r.Context(), http.MethodPost, "/v1/admin/invoices/"+id+"/reissue", body, &out); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/console/invoices/"+strconv.FormatInt(out.Invoice.ID, 10))
}

// documentPDF serves the admin API's PDF of a document (below apiPrefix, named what in
// its error pages) as it renders it: its type and file name, or its error.
func (c *Console) documentPDF(apiPrefix, what string) page {
	return func(w http.ResponseWriter, r *http.Request, v *view) {
		id, ok := docID(r)
		if !ok {
			c.fail(w, r, v, http.StatusNotFound, "There is no such "+what+".")
			return
		}
		rep, err := v.raw(r.Context(), http.MethodGet, apiPrefix+id+".pdf", nil)
		if err == nil && rep.status >= 300 {
			err = replyError(rep)
		}
		if err != nil {
			c.apiFailed(w, r, v, err)
			return
		}
		sendDocument(w, rep)
	}
}

// sendDocument sends a document the API rendered (a PDF) as it is: its type and file name.
func sendDocument(w http.ResponseWriter, rep *reply) {
	h := w.Header()
	for _, k := range []string{"Content-Type", "Content-Disposition"} {
		if x := rep.header.Get(k); x != "" {
			h.Set(k, x)
		}
	}
	h.Set("Content-Length", strconv.Itoa(rep.body.Len()))
	w.WriteHeader(http.StatusOK)
	_, _ = rep.body.WriteTo(w) // a failed write means the client left
}

// replyError is the *apiError of an error reply of the admin API (as view.call reads it).
func replyError(rep *reply) error {
	var e struct{ Error apiError }
	if json.Unmarshal(rep.body.Bytes(), &e) != nil || e.Error.Code == "" {
		return &apiError{Status: rep.status, Code: "error", Message: strings.TrimSpace(rep.body.String())}
	}
	e.Error.Status = rep.status
	return &e.Error
}

func (c *Console) creditNotes(w http.ResponseWriter, r *http.Request, v *view) {
	in := r.URL.Query()
	org := strings.TrimSpace(in.Get("org"))
	q := url.Values{"limit": {strconv.Itoa(pageSize)}}
	if org != "" {
		q.Set("org", org)
	}
	if after := in.Get("after"); after != "" {
		q.Set("after", after)
	}
	var list struct {
		CreditNotes []invoice.CreditNote `json:"credit_notes"`
		NextAfter   *int64               `json:"next_after"`
	}
	if err := v.call(r.Context(), http.MethodGet, "/v1/admin/credit-notes?"+q.Encode(), nil, &list); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	var next string
	if list.NextAfter != nil {
		nq := url.Values{"after": {strconv.FormatInt(*list.NextAfter, 10)}}
		if org != "" {
			nq.Set("org", org)
		}
		next = "/console/credit-notes?" + nq.Encode()
	}
	v.Title, v.Nav = "Credit notes", "credit-notes"
	c.render(w, r, v, http.StatusOK, "credit_notes", struct {
		Org         string
		CreditNotes []invoice.CreditNote
		Next        string
	}{org, list.CreditNotes, next})
}

func (c *Console) creditNote(w http.ResponseWriter, r *http.Request, v *view) {
	id, ok := docID(r)
	if !ok {
		c.fail(w, r, v, http.StatusNotFound, "There is no such credit note.")
		return
	}
	var n invoice.CreditNote
	if err := v.call(r.Context(), http.MethodGet, "/v1/admin/credit-notes/"+id, nil, &n); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	v.Title, v.Nav = "Credit note "+n.Number, "credit-notes"
	c.render(w, r, v, http.StatusOK, "credit_note", newCreditNotePage(n))
}

// creditNotePage is a credit note as its page (the console's and the portal's) shows it.
type creditNotePage struct {
	invoice.CreditNote
	TaxRate       string
	Seller, Buyer []string
}

func newCreditNotePage(n invoice.CreditNote) creditNotePage {
	return creditNotePage{n, taxRate(n.TaxRateBP), partyLines(n.Seller), partyLines(n.Buyer)}
}
