package console

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/policy"
)

// PortalRoutes lists every route of the portal, as the mux's patterns, and the scope each
// needs of the session's token ("" for any; the pages of accounts need usage:read or
// billing:read, and show what each allows). A test walks them all.
var PortalRoutes = map[string]customer.Scope{
	"GET /portal/static/{file}":  "",
	"GET /portal/session/{code}": "",
	"POST /portal/sign-out":      "",

	"GET /portal/{$}":                              "",
	"GET /portal/accounts/{id}":                    "",
	"POST /portal/accounts/{id}/children":          customer.AccountsWrite,
	"POST /portal/accounts/{id}/limits":            customer.AccountsWrite,
	"GET /portal/accounts/{id}/keys":               customer.KeysWrite,
	"POST /portal/accounts/{id}/keys":              customer.KeysWrite,
	"POST /portal/accounts/{id}/keys/{key}/revoke": customer.KeysWrite,
	"GET /portal/invoices":                         customer.BillingRead,
	"GET /portal/invoices/{id}":                    customer.BillingRead,
	"GET /portal/invoices/{id}/pdf":                customer.BillingRead,
	"GET /portal/credit-notes/{id}":                customer.BillingRead,
	"GET /portal/credit-notes/{id}/pdf":            customer.BillingRead,
}

// PortalOpen are the routes served without a session: the stylesheets and the links.
var PortalOpen = map[string]bool{
	"GET /portal/static/{file}":  true,
	"GET /portal/session/{code}": true,
}

func (p *Portal) routes() {
	pages := map[string]portalPage{
		"POST /portal/sign-out":                        p.signOut,
		"GET /portal/{$}":                              p.overview,
		"GET /portal/accounts/{id}":                    p.account,
		"POST /portal/accounts/{id}/children":          p.createChild,
		"POST /portal/accounts/{id}/limits":            p.setLimits,
		"GET /portal/accounts/{id}/keys":               p.keys,
		"POST /portal/accounts/{id}/keys":              p.createKey,
		"POST /portal/accounts/{id}/keys/{key}/revoke": p.revokeKey,
		"GET /portal/invoices":                         p.invoices,
		"GET /portal/invoices/{id}":                    p.invoice,
		"GET /portal/invoices/{id}/pdf":                p.documentPDF("/v1/portal/invoices/", "invoice"),
		"GET /portal/credit-notes/{id}":                p.creditNote,
		"GET /portal/credit-notes/{id}/pdf":            p.documentPDF("/v1/portal/credit-notes/", "credit note"),
	}
	for pattern, scope := range PortalRoutes {
		switch pattern {
		case "GET /portal/static/{file}":
			p.mux.HandleFunc(pattern, p.portalStatic)
		case "GET /portal/session/{code}":
			p.mux.HandleFunc(pattern, p.openSession)
		default:
			pg, ok := pages[pattern]
			if !ok {
				panic("console: no portal page for " + pattern)
			}
			p.mux.HandleFunc(pattern, p.signedIn(scope, pg))
			delete(pages, pattern)
		}
	}
	for pattern := range pages {
		panic("console: a portal page not in PortalRoutes: " + pattern)
	}
	p.mux.HandleFunc("/portal/", p.signedIn("", func(w http.ResponseWriter, r *http.Request, v *portalView) {
		p.fail(w, r, v, http.StatusNotFound, "There is no such page.")
	}))
}

// The customer API's replies, as the pages read them (docs/portal.md).
type (
	// portalAccount is GET /v1/portal/accounts/{id}.
	portalAccount struct {
		Account struct {
			ID          string                       `json:"id"`
			Kind        policy.Kind                  `json:"kind"`
			Parent      string                       `json:"parent"`
			Plan        string                       `json:"plan"`
			Limits      map[policy.Unit]policy.Limit `json:"limits"`
			Concurrency *int                         `json:"concurrency"` // nil: inherited
		} `json:"account"`
		Levels    []portalLevel         `json:"levels"`
		Remaining map[policy.Unit]int64 `json:"remaining"`
		Writable  bool                  `json:"writable"`
	}
	// portalLevel is an account of the path from the token's account down to the page's.
	portalLevel struct {
		Account string                       `json:"account"`
		Kind    policy.Kind                  `json:"kind"`
		Plan    string                       `json:"plan"`
		Limits  map[policy.Unit]policy.Limit `json:"limits"`
		Quotas  map[policy.Unit]portalQuota  `json:"quotas"`
	}
	// portalQuota is a level's quota of a unit, live: quota and remaining -1 when uncapped.
	portalQuota struct {
		Used      int64     `json:"used"`
		Quota     int64     `json:"quota"`
		Remaining int64     `json:"remaining"`
		Period    string    `json:"period"`
		ResetsAt  time.Time `json:"resets_at"`
	}
	// portalUsage is GET /v1/portal/accounts/{id}/usage.
	portalUsage struct {
		Series []struct {
			Account string       `json:"account"`
			Points  []usagePoint `json:"points"`
		} `json:"series"`
		Totals usagePoint `json:"totals"`
	}
	// usagePoint is what was used in a day or month (Start, YYYY-MM-DD), from the billing log.
	usagePoint struct {
		Start      string `json:"start"`
		Events     int64  `json:"events"`
		Requests   int64  `json:"requests"`
		Tokens     int64  `json:"tokens"`
		Credits    int64  `json:"credits"`
		CostMicros int64  `json:"cost_micros"`
	}
	// portalChild is an account of GET /v1/portal/accounts/{id}/children.
	portalChild struct {
		ID   string      `json:"id"`
		Kind policy.Kind `json:"kind"`
		Plan string      `json:"plan"`
	}
	// portalKey is an API key of GET /v1/portal/accounts/{id}/api-keys; Secret only from
	// its POST, once.
	portalKey struct {
		ID        string     `json:"id"`
		Account   string     `json:"account"`
		CreatedAt time.Time  `json:"created_at"`
		RevokedAt *time.Time `json:"revoked_at"`
		Secret    string     `json:"api_key"`
	}
)

// of is the point's use of unit u.
func (pt usagePoint) of(u policy.Unit) int64 {
	switch u {
	case policy.Requests:
		return pt.Requests
	case policy.Tokens:
		return pt.Tokens
	case policy.Credits:
		return pt.Credits
	case policy.CostMicros:
		return pt.CostMicros
	}
	return 0
}

// add is the sum of two points.
func (pt usagePoint) add(o usagePoint) usagePoint {
	return usagePoint{Start: pt.Start, Events: pt.Events + o.Events, Requests: pt.Requests + o.Requests,
		Tokens: pt.Tokens + o.Tokens, Credits: pt.Credits + o.Credits, CostMicros: pt.CostMicros + o.CostMicros}
}

// accountData is the data of the overview and of an account's page.
type accountData struct {
	ID   string
	Kind policy.Kind
	// Path is the accounts from the token's down to this one (usage:read).
	Path []portalLevel
	// Usage, with usage:read: what remains now of each quota, the levels' limits, the
	// charts, and the accounts below.
	View      *portalAccount
	UsageErr  string // why the usage charts are not shown
	Remaining []remainingRow
	Limits    []levelRow
	Month     []chart
	Year      []chart
	ByChild   []chart
	Children  []childRow
	NextChild string
	// Balance and TopUp, with billing:read.
	Balance *credit.Balance
	TopUp   string
	// The forms, with accounts:write: create an account below this one, and this one's
	// limits (Writable: it is below the token's account).
	CanCreate bool
	Writable  bool
	Kinds     []policy.Kind
	Units     []policy.Unit
	Own       map[policy.Unit]policy.Limit
}

// remainingRow is what an account may still use of a unit now: the least of its levels,
// and when the level that holds it back resets.
type remainingRow struct {
	Unit      policy.Unit
	Remaining int64
	Level     string
	Period    string
	ResetsAt  time.Time
}

// levelRow is a level's limit and quota of a unit.
type levelRow struct {
	Account string
	Unit    policy.Unit
	Rate    string
	Quota   *portalQuota
}

// childRow is an account below, with what it used this month.
type childRow struct {
	portalChild
	Used usagePoint
}

func (p *Portal) overview(w http.ResponseWriter, r *http.Request, v *portalView) {
	p.accountPage(w, r, v, v.Token.Account)
}

func (p *Portal) account(w http.ResponseWriter, r *http.Request, v *portalView) {
	id := r.PathValue("id")
	if id == v.Token.Account {
		http.Redirect(w, r, "/portal/", http.StatusSeeOther)
		return
	}
	if !v.Has(string(customer.UsageRead)) && !v.Has(string(customer.BillingRead)) {
		p.fail(w, r, v, http.StatusForbidden, "Your access does not include accounts (it needs usage:read or billing:read).")
		return
	}
	p.accountPage(w, r, v, id)
}

// accountPage renders account id as the token's scopes allow: its usage and limits
// (usage:read), its balance (billing:read) and its forms (accounts:write). The customer
// API answers 404 for an account outside the token's subtree.
func (p *Portal) accountPage(w http.ResponseWriter, r *http.Request, v *portalView, id string) {
	if !policy.ValidID(id) {
		p.fail(w, r, v, http.StatusNotFound, "There is no such account.")
		return
	}
	ctx := r.Context()
	d := accountData{ID: id, Units: policy.Units, Kinds: []policy.Kind{policy.Team, policy.User, policy.Agent}}
	base := "/v1/portal/accounts/" + url.PathEscape(id)
	if v.Has(string(customer.UsageRead)) {
		var a portalAccount
		if err := v.call(ctx, http.MethodGet, base, nil, &a); err != nil {
			p.apiFailed(w, r, v, err)
			return
		}
		d.View, d.Kind, d.Path, d.Writable, d.Own = &a, a.Account.Kind, a.Levels, a.Writable, a.Account.Limits
		d.Remaining, d.Limits = remainingRows(a), levelRows(a)
		used, err := p.usageCharts(r, v, base, &d)
		var e *apiError
		if errors.As(err, &e) && e.Status == http.StatusServiceUnavailable {
			// The rest of the page is worth showing without the billing log.
			p.cfg.Log.Warn("portal: usage", "account", id, "err", err)
			d.UsageErr, err = "Usage cannot be read right now; retry shortly.", nil
		}
		if err == nil {
			err = p.children(r, v, base, used, &d)
		}
		if err != nil {
			p.apiFailed(w, r, v, err)
			return
		}
	}
	if v.Has(string(customer.BillingRead)) {
		var b credit.Balance
		if err := v.call(ctx, http.MethodGet, base+"/balance", nil, &b); err != nil {
			p.apiFailed(w, r, v, err)
			return
		}
		d.Balance, d.TopUp = &b, p.topUp(id)
	}
	// A child's kind is deeper than its parent's (an agent has none); the API checks it too.
	d.Kinds = slices.DeleteFunc(d.Kinds, func(k policy.Kind) bool { return d.Kind != "" && k.Depth() <= d.Kind.Depth() })
	d.CanCreate = v.Has(string(customer.AccountsWrite)) && len(d.Kinds) > 0
	v.Nav = "overview"
	switch {
	case id == v.Token.Account:
		v.Title = "Overview of " + id
	case d.Kind != "":
		v.Title, v.Nav = string(d.Kind)+" "+id, ""
	default:
		v.Title, v.Nav = "Account "+id, ""
	}
	p.render(w, r, v, http.StatusOK, "portal_account", d)
}

// remainingRows are what account a may use of each unit now, with the level that holds
// it back and when that level's quota resets.
func remainingRows(a portalAccount) []remainingRow {
	var out []remainingRow
	for _, u := range policy.Units {
		left, ok := a.Remaining[u]
		if !ok {
			continue
		}
		row := remainingRow{Unit: u, Remaining: left}
		for _, l := range a.Levels {
			if q, ok := l.Quotas[u]; ok && q.Quota >= 0 && q.Remaining == left {
				row.Level, row.Period, row.ResetsAt = l.Account, q.Period, q.ResetsAt
			}
		}
		out = append(out, row)
	}
	return out
}

// levelRows are the limits and live quotas of each level of a's path, unit by unit.
func levelRows(a portalAccount) []levelRow {
	var out []levelRow
	for _, l := range a.Levels {
		for _, u := range policy.Units {
			lim, hasLimit := l.Limits[u]
			q, hasQuota := l.Quotas[u]
			if !hasLimit && !hasQuota {
				continue
			}
			row := levelRow{Account: l.Account, Unit: u, Rate: describeRate(lim)}
			if hasQuota {
				row.Quota = &q
			}
			out = append(out, row)
		}
	}
	return out
}

// usageCharts reads account's usage (below base, its customer API path) and charts it:
// this month by day, the last twelve months by month, and this month by child; it returns
// what each child used this month.
func (p *Portal) usageCharts(r *http.Request, v *portalView, base string, d *accountData) (map[string]usagePoint, error) {
	ctx := r.Context()
	today := p.cfg.Now().UTC().Truncate(24 * time.Hour)
	month := time.Date(today.Year(), today.Month(), 1, 0, 0, 0, 0, time.UTC)
	tomorrow := today.AddDate(0, 0, 1)
	usage := func(from, to time.Time, granularity, by string) (portalUsage, error) {
		q := url.Values{"from": {from.Format(time.DateOnly)}, "to": {to.Format(time.DateOnly)}, "granularity": {granularity}}
		if by != "" {
			q.Set("by", by)
		}
		var u portalUsage
		err := v.call(ctx, http.MethodGet, base+"/usage?"+q.Encode(), nil, &u)
		return u, err
	}

	days, err := usage(month, tomorrow, "day", "")
	if err != nil {
		return nil, err
	}
	var labels []string
	for day := month; day.Before(tomorrow); day = day.AddDate(0, 0, 1) {
		labels = append(labels, day.Format(time.DateOnly))
	}
	d.Month = unitCharts(days, labels, func(start string) string { return start }, "per day this month, UTC")

	yearFrom := month.AddDate(0, -11, 0)
	months, err := usage(yearFrom, month.AddDate(0, 1, 0), "month", "")
	if err != nil {
		return nil, err
	}
	labels = nil
	for m := yearFrom; !m.After(month); m = m.AddDate(0, 1, 0) {
		labels = append(labels, m.Format("2006-01"))
	}
	d.Year = unitCharts(months, labels, monthOf, "per month, the last twelve months")

	byChild, err := usage(month, tomorrow, "month", "child")
	if err != nil {
		return nil, err
	}
	used := map[string]usagePoint{}
	for _, s := range byChild.Series {
		for _, pt := range s.Points {
			used[s.Account] = used[s.Account].add(pt)
		}
	}
	d.ByChild = childCharts(used)
	return used, nil
}

// children lists a page of the accounts below account (below base, its customer API
// path), with what each used this month (used).
func (p *Portal) children(r *http.Request, v *portalView, base string, used map[string]usagePoint, d *accountData) error {
	q := url.Values{"limit": {strconv.Itoa(pageSize)}}
	if after := r.URL.Query().Get("after"); after != "" {
		q.Set("after", after)
	}
	var children struct {
		Accounts []portalChild `json:"accounts"`
		Next     string        `json:"next"`
	}
	if err := v.call(r.Context(), http.MethodGet, base+"/children?"+q.Encode(), nil, &children); err != nil {
		return err
	}
	for _, c := range children.Accounts {
		d.Children = append(d.Children, childRow{portalChild: c, Used: used[c.ID]})
	}
	d.NextChild = children.Next
	return nil
}

// unitCharts charts u's one series (by unit), a chart per unit used, a bar per label; key
// is the label of a point's start.
func unitCharts(u portalUsage, labels []string, key func(start string) string, per string) []chart {
	at := map[string]usagePoint{}
	for _, s := range u.Series {
		for _, pt := range s.Points {
			at[key(pt.Start)] = at[key(pt.Start)].add(pt)
		}
	}
	var out []chart
	for _, unit := range policy.Units {
		values := make([]int64, len(labels))
		var total int64
		for i, l := range labels {
			values[i] = at[l].of(unit)
			total += values[i]
		}
		if total == 0 {
			continue
		}
		ch := newChart(string(unit)+" "+per, string(unit), labels, values)
		ch.Caption = fmt.Sprintf("%s %s (at most %s, in all %s), from the billing log", unit, per, formatNum(ch.Max), formatNum(total))
		out = append(out, ch)
	}
	return out
}

// maxChildBars bounds the bars of a chart by child: the accounts below that used most.
const maxChildBars = 24

// childCharts charts what each account below used this month, a chart per unit used,
// the accounts that used most first.
func childCharts(used map[string]usagePoint) []chart {
	var out []chart
	for _, unit := range policy.Units {
		var ids []string
		for id, pt := range used {
			if pt.of(unit) > 0 {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			continue
		}
		slices.SortFunc(ids, func(a, b string) int {
			return cmp.Or(cmp.Compare(used[b].of(unit), used[a].of(unit)), strings.Compare(a, b))
		})
		shown := ids[:min(len(ids), maxChildBars)]
		values := make([]int64, len(shown))
		for i, id := range shown {
			values[i] = used[id].of(unit)
		}
		ch := newChart(string(unit)+" by account below, this month", string(unit), shown, values)
		for i := range ch.Bars {
			ch.Bars[i].Legend = true
		}
		ch.Caption = fmt.Sprintf("%s this month by account below (%d of %d shown, most first), from the billing log", unit, len(shown), len(ids))
		out = append(out, ch)
	}
	return out
}

// createChild creates an account below account id (a team, user or agent): its limits are
// set on its page, within the token account's.
func (p *Portal) createChild(w http.ResponseWriter, r *http.Request, v *portalView) {
	body := map[string]any{"id": strings.TrimSpace(r.PostFormValue("id")), "kind": r.PostFormValue("kind"), "parent": r.PathValue("id")}
	var a struct {
		Account struct {
			ID string `json:"id"`
		} `json:"account"`
	}
	if err := v.call(r.Context(), http.MethodPost, "/v1/portal/accounts", body, &a); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/portal/accounts/"+url.PathEscape(a.Account.ID))
}

// setLimits sets account id's own limits from the form (as the console's account form),
// over the limits it has; the customer API refuses any above the token account's.
func (p *Portal) setLimits(w http.ResponseWriter, r *http.Request, v *portalView) {
	id := r.PathValue("id")
	path := "/v1/portal/accounts/" + url.PathEscape(id)
	var a portalAccount
	if err := v.call(r.Context(), http.MethodGet, path, nil, &a); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	limits, msg := formLimits(r, a.Account.Limits)
	if msg != "" {
		p.fail(w, r, v, http.StatusBadRequest, msg)
		return
	}
	body := map[string]any{"limits": limits}
	if a.Account.Concurrency != nil {
		body["concurrency"] = *a.Account.Concurrency
	}
	if err := v.call(r.Context(), http.MethodPut, path, body, nil); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/portal/accounts/"+url.PathEscape(id))
}

// keysData is the data of the API keys page.
type keysData struct {
	Account string
	Keys    []portalKey
	NewKey  *portalKey // just created: its secret, shown once
}

func (p *Portal) keys(w http.ResponseWriter, r *http.Request, v *portalView) {
	p.keysPage(w, r, v, http.StatusOK, nil)
}

func (p *Portal) keysPage(w http.ResponseWriter, r *http.Request, v *portalView, status int, created *portalKey) {
	id := r.PathValue("id")
	if !policy.ValidID(id) {
		p.fail(w, r, v, http.StatusNotFound, "There is no such account.")
		return
	}
	var list struct {
		Keys []portalKey `json:"api_keys"`
	}
	if err := v.call(r.Context(), http.MethodGet, "/v1/portal/accounts/"+url.PathEscape(id)+"/api-keys", nil, &list); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	v.Title, v.Nav = "API keys of "+id, "keys"
	p.render(w, r, v, status, "portal_keys", keysData{Account: id, Keys: list.Keys, NewKey: created})
}

func (p *Portal) createKey(w http.ResponseWriter, r *http.Request, v *portalView) {
	var k portalKey
	if err := v.call(r.Context(), http.MethodPost, "/v1/portal/accounts/"+url.PathEscape(r.PathValue("id"))+"/api-keys", nil, &k); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	v.Flash = "API key " + k.ID + " created. Its secret is shown once, below."
	p.keysPage(w, r, v, http.StatusCreated, &k)
}

func (p *Portal) revokeKey(w http.ResponseWriter, r *http.Request, v *portalView) {
	if err := v.call(r.Context(), http.MethodDelete, "/v1/portal/api-keys/"+url.PathEscape(r.PathValue("key")), nil, nil); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/portal/accounts/"+url.PathEscape(r.PathValue("id"))+"/keys")
}

// invoices lists the org's invoices and credit notes (empty unless the token's account is
// the org: the customer API's rule).
func (p *Portal) invoices(w http.ResponseWriter, r *http.Request, v *portalView) {
	var invs struct {
		Invoices []invoice.Invoice `json:"invoices"`
	}
	if err := v.call(r.Context(), http.MethodGet, "/v1/portal/invoices", nil, &invs); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	var notes struct {
		CreditNotes []invoice.CreditNote `json:"credit_notes"`
	}
	if err := v.call(r.Context(), http.MethodGet, "/v1/portal/credit-notes", nil, &notes); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	v.Title, v.Nav = "Invoices", "invoices"
	p.render(w, r, v, http.StatusOK, "portal_invoices", struct {
		Invoices    []invoice.Invoice
		CreditNotes []invoice.CreditNote
	}{invs.Invoices, notes.CreditNotes})
}

func (p *Portal) invoice(w http.ResponseWriter, r *http.Request, v *portalView) {
	id, ok := docID(r)
	if !ok {
		p.fail(w, r, v, http.StatusNotFound, "There is no such invoice.")
		return
	}
	var rec api.InvoiceRecord
	if err := v.call(r.Context(), http.MethodGet, "/v1/portal/invoices/"+id, nil, &rec); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	page := invoicePage{InvoiceRecord: rec, Month: monthOf(rec.Period), TaxRate: taxRate(rec.TaxRateBP),
		Seller: partyLines(rec.Seller), Buyer: partyLines(rec.Buyer)}
	v.Title, v.Nav = "Invoice "+page.Name(), "invoices"
	p.render(w, r, v, http.StatusOK, "portal_invoice", page)
}

func (p *Portal) creditNote(w http.ResponseWriter, r *http.Request, v *portalView) {
	id, ok := docID(r)
	if !ok {
		p.fail(w, r, v, http.StatusNotFound, "There is no such credit note.")
		return
	}
	var n invoice.CreditNote
	if err := v.call(r.Context(), http.MethodGet, "/v1/portal/credit-notes/"+id, nil, &n); err != nil {
		p.apiFailed(w, r, v, err)
		return
	}
	v.Title, v.Nav = "Credit note "+n.Number, "invoices"
	p.render(w, r, v, http.StatusOK, "portal_credit_note", newCreditNotePage(n))
}

// documentPDF serves the customer API's PDF of a document (below apiPrefix, named what in
// its error pages) as it renders it.
func (p *Portal) documentPDF(apiPrefix, what string) portalPage {
	return func(w http.ResponseWriter, r *http.Request, v *portalView) {
		id, ok := docID(r)
		if !ok {
			p.fail(w, r, v, http.StatusNotFound, "There is no such "+what+".")
			return
		}
		rep, err := v.raw(r.Context(), http.MethodGet, apiPrefix+id+".pdf", nil)
		if err == nil && rep.status >= 300 {
			err = replyError(rep)
		}
		if err != nil {
			p.apiFailed(w, r, v, err)
			return
		}
		sendDocument(w, rep)
	}
}
