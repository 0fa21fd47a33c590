package console

import (
	"context"
	_ "embed"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/billinglog"
	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/policy"
)

var (
	//go:embed sql/search_accounts.sql
	searchAccountsSQL string
	//go:embed sql/list_orgs.sql
	listOrgsSQL string
	//go:embed sql/account_children.sql
	accountChildrenSQL string
	//go:embed sql/account_keys.sql
	accountKeysSQL string
	//go:embed sql/recent_events.sql
	recentEventsSQL string
)

// pageSize is how many rows a list shows at once.
const pageSize = 50

// accountRow is an account in a list.
type accountRow struct {
	ID, Kind, Org, Plan, Name, Matched string
	Usage                              []unitUsage // live, for the rows that show it
}

// unitUsage is an account's use of one unit's quota this period, live from Redis.
type unitUsage struct {
	Unit   policy.Unit
	Period string
	admission.UnitUsage
}

func (c *Console) accountPages() map[string]page {
	return map[string]page{
		"GET /console/{$}":                                c.overview,
		"GET /console/accounts":                           c.accounts,
		"POST /console/accounts":                          c.createAccount,
		"GET /console/accounts/{id}":                      c.account,
		"POST /console/accounts/{id}":                     c.updateAccount,
		"POST /console/accounts/{id}/keys":                c.createKey,
		"POST /console/accounts/{id}/keys/{key}/revoke":   c.revokeKey,
		"POST /console/accounts/{id}/grants":              c.createGrant,
		"POST /console/accounts/{id}/grants/{grant}/void": c.voidGrant,
		"GET /console/why":                                c.why,
	}
}

func scanAccounts(rows pgx.Rows) ([]accountRow, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (accountRow, error) {
		var a accountRow
		err := r.Scan(&a.ID, &a.Kind, &a.Org, &a.Plan, &a.Name, &a.Matched)
		return a, err
	})
}

// likeEscape escapes LIKE's wildcards in s.
func likeEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// accounts is the account search: by a prefix of the id, an API key id, or a part of an
// org's legal name; without a query, the orgs by id.
func (c *Console) accounts(w http.ResponseWriter, r *http.Request, v *view) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if len(q) > 200 {
		q = q[:200]
	}
	after := r.URL.Query().Get("after")
	var rows pgx.Rows
	var err error
	if q == "" {
		rows, err = c.cfg.Pool.Query(r.Context(), listOrgsSQL, pgx.StrictNamedArgs{"after": after, "limit": pageSize + 1})
	} else {
		rows, err = c.cfg.Pool.Query(r.Context(), searchAccountsSQL, pgx.StrictNamedArgs{
			"q": q, "prefix": likeEscape(q) + "%", "contains": "%" + likeEscape(q) + "%", "limit": pageSize})
	}
	var list []accountRow
	if err == nil {
		list, err = scanAccounts(rows)
	}
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	list = dedupe(list)
	var next string
	if q == "" && len(list) > pageSize {
		list, next = list[:pageSize], list[pageSize-1].ID
	}
	var plans []policy.Plan
	if v.Can("POST /v1/admin/accounts") {
		if err := v.call(r.Context(), http.MethodGet, "/v1/admin/plans", nil, &struct {
			Plans *[]policy.Plan `json:"plans"`
		}{&plans}); err != nil {
			c.apiFailed(w, r, v, err)
			return
		}
	}
	v.Title, v.Nav = "Accounts", "accounts"
	c.render(w, r, v, http.StatusOK, "accounts", struct {
		Q, Next  string
		Accounts []accountRow
		Kinds    []policy.Kind
		Plans    []policy.Plan
	}{q, next, list, []policy.Kind{policy.Org, policy.Team, policy.User, policy.Agent}, plans})
}

// dedupe keeps the first row of each account.
func dedupe(list []accountRow) []accountRow {
	seen := map[string]bool{}
	return slices.DeleteFunc(list, func(a accountRow) bool {
		if seen[a.ID] {
			return true
		}
		seen[a.ID] = true
		return false
	})
}

func (c *Console) createAccount(w http.ResponseWriter, r *http.Request, v *view) {
	body := map[string]any{"id": strings.TrimSpace(r.PostFormValue("id")), "kind": r.PostFormValue("kind"),
		"parent": strings.TrimSpace(r.PostFormValue("parent")), "plan": r.PostFormValue("plan")}
	var a policy.Account
	if err := v.call(r.Context(), http.MethodPost, "/v1/admin/accounts", body, &a); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/console/accounts/"+url.PathEscape(a.ID))
}

// accountReply is GET /v1/admin/accounts/{id}.
type accountReply struct {
	policy.Account
	Effective *policy.Resolved `json:"effective"`
}

// limitRow is one unit's limit at one level of an account's path, and where it comes from.
type limitRow struct {
	Account string
	Unit    policy.Unit
	policy.Limit
	From string // "override" (the account's own) or "plan <id>"
}

// key is an API key of the account page.
type key struct {
	ID        string
	CreatedAt time.Time
	RevokedAt *time.Time
}

// event is an admission of the billing log.
type event struct {
	ID, Account, APIKey, IdempotencyKey string
	Time                                time.Time
	Requests, Tokens, Credits, Cost     int64
	ShadowRefusal                       string
	HasOutcome, Voided                  bool
}

// accountPage is the data of the account page.
type accountPage struct {
	Account   accountReply
	Path      []string
	Limits    []limitRow
	Usage     []unitUsage
	UsageErr  string
	Charts    []chart
	Children  []accountRow
	NextChild string
	Keys      []key
	NewKey    *newKey
	Alerts    []policy.AlertRule
	Events    []event
	Refusals  []Refusal
	Plans     []policy.Plan
	Units     []policy.Unit
	Own       map[policy.Unit]policy.Limit
	// Balance is the account's credit balances and grants (nil: none or not read);
	// BalanceErr says why not read.
	Balance    *credit.Balance
	BalanceErr string
	// GrantKey is the idempotency key of the grant form: a form sent twice grants once.
	GrantKey string
}

// newKey is an API key just created, its secret shown once.
type newKey struct {
	ID     string `json:"id"`
	Secret string `json:"api_key"`
}

func (c *Console) account(w http.ResponseWriter, r *http.Request, v *view) {
	c.accountView(w, r, v, http.StatusOK, nil)
}

func (c *Console) accountView(w http.ResponseWriter, r *http.Request, v *view, status int, created *newKey) {
	id := r.PathValue("id")
	if !policy.ValidID(id) {
		c.fail(w, r, v, http.StatusNotFound, "There is no such account.")
		return
	}
	ctx := r.Context()
	var p accountPage
	p.NewKey = created
	if err := v.call(ctx, http.MethodGet, "/v1/admin/accounts/"+id, nil, &p.Account); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	p.Units = []policy.Unit{policy.Requests, policy.Tokens, policy.Credits, policy.CostMicros}
	p.Own = p.Account.Limits
	if eff := p.Account.Effective; eff != nil {
		for _, l := range eff.Path {
			p.Path = append(p.Path, l.Account)
			for _, u := range p.Units {
				lim, ok := l.Limits[u]
				if !ok {
					continue
				}
				from := "plan " + l.Plan
				if l.Account == id {
					if _, own := p.Own[u]; own {
						from = "override"
					}
				} else {
					from = "inherited: " + from
				}
				p.Limits = append(p.Limits, limitRow{Account: l.Account, Unit: u, Limit: lim, From: from})
			}
		}
		p.Usage, p.UsageErr = c.liveUsage(r, id)
	}
	after := r.URL.Query().Get("after")
	rows, err := c.cfg.Pool.Query(ctx, accountChildrenSQL, pgx.StrictNamedArgs{"parent": id, "after": after, "limit": pageSize + 1})
	if err == nil {
		p.Children, err = scanAccounts(rows)
	}
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	if len(p.Children) > pageSize {
		p.Children, p.NextChild = p.Children[:pageSize], p.Children[pageSize-1].ID
	}
	for i := range p.Children {
		p.Children[i].Usage, _ = c.liveUsage(r, p.Children[i].ID)
	}
	if p.Keys, err = c.keys(r, id); err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	since := c.now().UTC().AddDate(0, 0, -29).Truncate(24 * time.Hour)
	if p.Charts, err = c.usageCharts(r, id, since); err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	if p.Events, err = c.recentEvents(r, id, c.now().Add(-24*time.Hour), 20); err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	if c.cfg.Refusals != nil {
		p.Refusals, err = c.cfg.Refusals.Recent(ctx, p.Account.Org, 50)
		if err != nil {
			c.cfg.Log.Warn("console: read refusals", "org", p.Account.Org, "err", err)
		}
		p.Refusals = slices.DeleteFunc(p.Refusals, func(f Refusal) bool {
			return f.Account != id && f.Blocked.Account != id
		})
	}
	if c.cfg.Balances != nil {
		bal, err := c.cfg.Balances.Balance(ctx, id)
		switch {
		case err != nil:
			c.cfg.Log.Warn("console: read balance", "account", id, "err", err)
			p.BalanceErr = "the balance cannot be read right now"
		case len(bal.Units) > 0:
			p.Balance = &bal
		}
	}
	p.GrantKey = "console-" + random(16)
	var alerts struct {
		Alerts []policy.AlertRule `json:"alerts"`
	}
	if err := v.call(ctx, http.MethodGet, "/v1/admin/alerts?account="+url.QueryEscape(id), nil, &alerts); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	p.Alerts = alerts.Alerts
	if v.Can("PUT /v1/admin/accounts/{id}") {
		if err := v.call(ctx, http.MethodGet, "/v1/admin/plans", nil, &struct {
			Plans *[]policy.Plan `json:"plans"`
		}{&p.Plans}); err != nil {
			c.apiFailed(w, r, v, err)
			return
		}
	}
	v.Title, v.Nav = string(p.Account.Kind)+" "+id, "accounts"
	c.render(w, r, v, status, "account", p)
}

// liveUsage reads account's quota counters from Redis; an error is shown, not fatal.
func (c *Console) liveUsage(r *http.Request, account string) ([]unitUsage, string) {
	pol, err := c.cfg.Policies.Resolve(account)
	if err != nil {
		return nil, "not in this node's policies yet"
	}
	used, err := c.cfg.Counters.Usage(r.Context(), pol)
	if err != nil {
		c.cfg.Log.Warn("console: read usage", "account", account, "err", err)
		return nil, "Redis cannot be read right now"
	}
	out := make([]unitUsage, 0, len(used))
	for u, x := range used {
		out = append(out, unitUsage{Unit: u, Period: x.Period, UnitUsage: x})
	}
	slices.SortFunc(out, func(a, b unitUsage) int { return strings.Compare(string(a.Unit), string(b.Unit)) })
	return out, ""
}

func (c *Console) keys(r *http.Request, account string) ([]key, error) {
	rows, err := c.cfg.Pool.Query(r.Context(), accountKeysSQL, pgx.StrictNamedArgs{"account": account})
	if err != nil {
		return nil, fmt.Errorf("read api keys: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (key, error) {
		var k key
		err := r.Scan(&k.ID, &k.CreatedAt, &k.RevokedAt)
		return k, err
	})
}

// usageCharts charts what account and those below it used per day since since, a chart
// per unit used, from the billing log's daily rollup (a row per day: read on every view).
func (c *Console) usageCharts(r *http.Request, account string, since time.Time) ([]chart, error) {
	today := c.now().UTC().Truncate(24 * time.Hour)
	byDay, err := c.dailyUsage(r.Context(), account, since, today.AddDate(0, 0, 1))
	if err != nil {
		return nil, err
	}
	var labels []string
	for d := since; !d.After(c.now()); d = d.AddDate(0, 0, 1) {
		labels = append(labels, d.Format(time.DateOnly))
	}
	var out []chart
	for i, u := range []policy.Unit{policy.Requests, policy.Tokens, policy.Credits, policy.CostMicros} {
		values := make([]int64, len(labels))
		var total int64
		for j, l := range labels {
			values[j] = byDay[l][i]
			total += values[j]
		}
		if total > 0 {
			ch := newChart(string(u)+" per day", string(u), labels, values)
			ch.Caption = fmt.Sprintf("%s per day, UTC (at most %s a day), from the billing log", u, formatNum(ch.Max))
			out = append(out, ch)
		}
	}
	return out, nil
}

// dailyUsage reads what account and those below it used per UTC day from since until
// before until, in billable units (billinglog.Daily: a row per day, whatever the events).
func (c *Console) dailyUsage(ctx context.Context, account string, since, until time.Time) (map[string][4]int64, error) {
	days, err := billinglog.Daily(ctx, c.cfg.Pool, []string{account}, since, until)
	if err != nil {
		return nil, err
	}
	byDay := make(map[string][4]int64, len(days))
	for _, d := range days {
		byDay[d.Day.Format(time.DateOnly)] = [4]int64{d.Requests, d.Tokens, d.Credits, d.CostMicros}
	}
	return byDay, nil
}

func (c *Console) recentEvents(r *http.Request, account string, since time.Time, limit int) ([]event, error) {
	rows, err := c.cfg.Pool.Query(r.Context(), recentEventsSQL, pgx.StrictNamedArgs{"account": account, "since": since, "limit": limit})
	if err != nil {
		return nil, fmt.Errorf("read recent events: %w", err)
	}
	return pgx.CollectRows(rows, scanEvent)
}

func scanEvent(r pgx.CollectableRow) (event, error) {
	var e event
	err := r.Scan(&e.ID, &e.Time, &e.Account, &e.APIKey, &e.IdempotencyKey, &e.Requests, &e.Tokens, &e.Credits, &e.Cost,
		&e.ShadowRefusal, &e.HasOutcome, &e.Voided)
	return e, err
}

// updateAccount changes an account's plan and its own limits: the form's fields per unit
// (rate_per_s and burst of a token bucket, a quota and its period), over the overrides
// it has (so a sliding window or a ceiling the form does not show is kept).
func (c *Console) updateAccount(w http.ResponseWriter, r *http.Request, v *view) {
	id := r.PathValue("id")
	var a accountReply
	if err := v.call(r.Context(), http.MethodGet, "/v1/admin/accounts/"+url.PathEscape(id), nil, &a); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	limits, msg := formLimits(r, a.Limits)
	if msg != "" {
		c.fail(w, r, v, http.StatusBadRequest, msg)
		return
	}
	body := map[string]any{"kind": a.Kind, "parent": a.Parent, "plan": r.PostFormValue("plan"), "limits": limits,
		"concurrency": a.Concurrency, "priority": a.Priority, "shadow": a.Shadow}
	if err := v.call(r.Context(), http.MethodPut, "/v1/admin/accounts/"+url.PathEscape(id), body, nil); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/console/accounts/"+url.PathEscape(id))
}

// formLimits is own with the form's limits applied; a message for a field that is not a
// number.
func formLimits(r *http.Request, own map[policy.Unit]policy.Limit) (map[policy.Unit]policy.Limit, string) {
	out := map[policy.Unit]policy.Limit{}
	for _, u := range []policy.Unit{policy.Requests, policy.Tokens, policy.Credits, policy.CostMicros} {
		l := own[u]
		rate, burst, quota := r.PostFormValue("rate."+string(u)), r.PostFormValue("burst."+string(u)), r.PostFormValue("quota."+string(u))
		if r.PostForm.Has("rate." + string(u)) {
			if rate == "" {
				if l.Algorithm == policy.TokenBucket {
					l.Algorithm, l.RatePerS, l.Burst, l.Ceiling = "", 0, 0, 0
				}
			} else {
				f, err := strconv.ParseFloat(rate, 64)
				b, berr := strconv.ParseInt(burst, 10, 64)
				if err != nil || berr != nil {
					return nil, fmt.Sprintf("The rate and burst of %s must be numbers.", u)
				}
				l.Algorithm, l.RatePerS, l.Burst, l.Limit, l.WindowS = policy.TokenBucket, f, b, 0, 0
			}
		}
		if r.PostForm.Has("quota." + string(u)) {
			if quota == "" {
				l.Quota, l.QuotaPeriod = nil, ""
			} else {
				q, err := strconv.ParseInt(quota, 10, 64)
				if err != nil {
					return nil, fmt.Sprintf("The quota of %s must be a whole number.", u)
				}
				l.Quota, l.QuotaPeriod = &q, policy.QuotaPeriod(r.PostFormValue("period."+string(u)))
			}
		}
		if l != (policy.Limit{}) {
			out[u] = l
		}
	}
	return out, ""
}

func (c *Console) createKey(w http.ResponseWriter, r *http.Request, v *view) {
	var k newKey
	if err := v.call(r.Context(), http.MethodPost, "/v1/admin/api-keys", map[string]string{"account": r.PathValue("id")}, &k); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	v.Flash = "API key " + k.ID + " created. Its secret is shown once, below."
	c.accountView(w, r, v, http.StatusCreated, &k)
}

func (c *Console) revokeKey(w http.ResponseWriter, r *http.Request, v *view) {
	if err := v.call(r.Context(), http.MethodDelete, "/v1/admin/api-keys/"+url.PathEscape(r.PathValue("key")), nil, nil); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/console/accounts/"+url.PathEscape(r.PathValue("id")))
}

// createGrant grants prepaid credits to the account: the form's unit, amount, expiry (a
// date, at its UTC midnight) and source, with the form's idempotency key.
func (c *Console) createGrant(w http.ResponseWriter, r *http.Request, v *view) {
	id := r.PathValue("id")
	amount, err := strconv.ParseInt(strings.TrimSpace(r.PostFormValue("amount")), 10, 64)
	if err != nil || amount <= 0 {
		c.fail(w, r, v, http.StatusBadRequest, "The amount must be a whole number above 0.")
		return
	}
	body := map[string]any{"unit": r.PostFormValue("unit"), "amount": amount, "source": strings.TrimSpace(r.PostFormValue("source")),
		"idempotency_key": r.PostFormValue("idempotency_key")}
	if exp := strings.TrimSpace(r.PostFormValue("expires")); exp != "" {
		day, err := time.Parse(time.DateOnly, exp)
		if err != nil {
			c.fail(w, r, v, http.StatusBadRequest, "The expiry must be a date, YYYY-MM-DD.")
			return
		}
		body["expires_at"] = day.UTC().Format(time.RFC3339)
	}
	if err := v.call(r.Context(), http.MethodPost, "/v1/admin/accounts/"+url.PathEscape(id)+"/grants", body, nil); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/console/accounts/"+url.PathEscape(id))
}

func (c *Console) voidGrant(w http.ResponseWriter, r *http.Request, v *view) {
	id := r.PathValue("id")
	path := "/v1/admin/accounts/" + url.PathEscape(id) + "/grants/" + url.PathEscape(r.PathValue("grant"))
	if err := v.call(r.Context(), http.MethodDelete, path, nil, nil); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/console/accounts/"+url.PathEscape(id))
}
