package api

import (
	"context"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/billinglog"
	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/period"
)

// UsageLog reads what accounts used, each with everything below it, per UTC day of event
// time from the billing log: billable units, as invoices count them (the daily rollup of
// billable_events, billinglog.Daily).
type UsageLog interface {
	Daily(ctx context.Context, accounts []string, from, to time.Time) ([]billinglog.DayUsage, error)
}

// UsageOf is the UsageLog of a PostgreSQL pool.
type UsageOf struct{ Pool *pgxpool.Pool }

// Daily reads the pool's daily rollup (billinglog.Daily).
func (u UsageOf) Daily(ctx context.Context, accounts []string, from, to time.Time) ([]billinglog.DayUsage, error) {
	return billinglog.Daily(ctx, u.Pool, accounts, from, to)
}

// Usage is billable usage: the admissions recorded (events, those that bill nothing, voided
// or refunded, included) and the units they bill.
type Usage struct {
	Events     int64 `json:"events"`
	Requests   int64 `json:"requests"`
	Tokens     int64 `json:"tokens"`
	Credits    int64 `json:"credits"`
	CostMicros int64 `json:"cost_micros"`
}

func (u *Usage) add(d billinglog.DayUsage) {
	u.Events += d.Events
	u.Requests += d.Requests
	u.Tokens += d.Tokens
	u.Credits += d.Credits
	u.CostMicros += d.CostMicros
}

// The bounds of a usage query: a day series covers at most maxDays, a month series at
// most maxMonths.
const (
	maxDays   = 366
	maxMonths = 60
)

// usageView is the reply of GET /v1/portal/accounts/{id}/usage.
type usageView struct {
	Account     string        `json:"account"`
	From        string        `json:"from"`
	To          string        `json:"to"`
	Granularity string        `json:"granularity"`
	By          string        `json:"by"`
	Series      []usageSeries `json:"series"`
	Totals      Usage         `json:"totals"` // of the account, over the whole range
	Next        string        `json:"next,omitempty"`
}

type usageSeries struct {
	Account string       `json:"account"`
	Points  []usagePoint `json:"points"`
}

type usagePoint struct {
	Start string `json:"start"` // the day, or the month's first day, YYYY-MM-DD
	Usage
}

// portalUsage is GET /v1/portal/accounts/{id}/usage?from=&to=&granularity=&by=: what the
// account (by=unit, the default) or each of its children (by=child, a page of them: after,
// limit) used per day or month over [from, to), from the billing log, exactly.
func (s *Server) portalUsage(w http.ResponseWriter, r *http.Request, tok customer.Token) {
	id := r.PathValue("id")
	if _, e := s.within(tok, id); e != nil {
		writeError(w, e)
		return
	}
	q := r.URL.Query()
	v := usageView{Account: id, Granularity: q.Get("granularity"), By: q.Get("by")}
	if v.Granularity == "" {
		v.Granularity = "day"
	}
	if v.By == "" {
		v.By = "unit"
	}
	if v.Granularity != "day" && v.Granularity != "month" {
		writeError(w, badRequest("invalid_granularity", "granularity must be day or month"))
		return
	}
	if v.By != "unit" && v.By != "child" {
		writeError(w, badRequest("invalid_by", "by must be unit or child"))
		return
	}
	from, to, e := usageRange(q.Get("from"), q.Get("to"), v.Granularity, s.cfg.Clock.Now())
	if e != nil {
		writeError(w, e)
		return
	}
	v.From, v.To = from.Format(time.DateOnly), to.Format(time.DateOnly)
	accounts := []string{id}
	if v.By == "child" {
		kids, next, e := s.children(r, id)
		if e != nil {
			writeError(w, e)
			return
		}
		v.Next = next
		for _, k := range kids {
			accounts = append(accounts, k.ID)
		}
	}
	if s.cfg.Usage == nil {
		writeError(w, unavailable("the customer API has no billing log configured"))
		return
	}
	days, err := s.cfg.Usage.Daily(r.Context(), accounts, from, to)
	if err != nil {
		s.cfg.Log.Error("portal: read usage", "account", id, "err", err)
		writeError(w, unavailable("usage cannot be read now; retry later"))
		return
	}
	v.Series, v.Totals = usageSeriesOf(accounts, days, from, to, v.Granularity, v.By == "child")
	writeJSON(w, http.StatusOK, v)
}

// usageRange reads from and to (YYYY-MM-DD; to exclusive) with their defaults: the current
// month to today by day, the last 12 months by month; a month series runs from the first
// of from's month.
func usageRange(rawFrom, rawTo, granularity string, now time.Time) (from, to time.Time, e *Error) {
	today := period.DayStart(now)
	if granularity == "month" {
		from, to = period.MonthStart(today).AddDate(0, -11, 0), period.MonthStart(today).AddDate(0, 1, 0)
	} else {
		from, to = period.MonthStart(today), today.AddDate(0, 0, 1)
	}
	for _, p := range []struct {
		raw  string
		into *time.Time
		name string
	}{{rawFrom, &from, "from"}, {rawTo, &to, "to"}} {
		if p.raw == "" {
			continue
		}
		t, err := time.Parse(time.DateOnly, p.raw)
		if err != nil {
			return from, to, badRequest("invalid_"+p.name, "%s must be a date, YYYY-MM-DD (UTC)", p.name)
		}
		*p.into = t
	}
	if granularity == "month" {
		from = period.MonthStart(from)
	}
	switch {
	case !to.After(from):
		return from, to, badRequest("invalid_range", "to must be after from")
	case granularity == "day" && to.Sub(from) > maxDays*24*time.Hour:
		return from, to, badRequest("invalid_range", "a day series covers at most %d days; ask for months", maxDays)
	case granularity == "month" && from.AddDate(0, maxMonths, 0).Before(to):
		return from, to, badRequest("invalid_range", "a month series covers at most %d months", maxMonths)
	}
	return from, to, nil
}

// usageSeriesOf buckets days into a series per account (the first alone unless byChild,
// then the others), each with every day or month of [from, to), zeros included, and the
// first account's totals.
func usageSeriesOf(accounts []string, days []billinglog.DayUsage, from, to time.Time, granularity string, byChild bool) ([]usageSeries, Usage) {
	var starts []time.Time
	step := func(t time.Time) time.Time { return t.AddDate(0, 0, 1) }
	bucket := func(t time.Time) time.Time { return t }
	if granularity == "month" {
		step = func(t time.Time) time.Time { return t.AddDate(0, 1, 0) }
		bucket = period.MonthStart
	}
	for t := from; t.Before(to); t = step(t) {
		starts = append(starts, t)
	}
	index := make(map[time.Time]int, len(starts))
	for i, t := range starts {
		index[t] = i
	}
	points := make(map[string][]usagePoint, len(accounts))
	for _, a := range accounts {
		p := make([]usagePoint, len(starts))
		for i, t := range starts {
			p[i].Start = t.Format(time.DateOnly)
		}
		points[a] = p
	}
	var totals Usage
	for _, d := range days {
		p, ok := points[d.Account]
		i, in := index[bucket(d.Day.UTC())]
		if !ok || !in {
			continue
		}
		p[i].add(d)
		if d.Account == accounts[0] {
			totals.add(d)
		}
	}
	series := accounts[:1]
	if byChild {
		series = accounts[1:]
	}
	out := make([]usageSeries, 0, len(series))
	for _, a := range series {
		out = append(out, usageSeries{Account: a, Points: points[a]})
	}
	return out, totals
}
