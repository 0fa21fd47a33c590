package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/billinglog"
)

// portalGoalMS is issue 33's goal for the portal's usage page over a year of one org's
// events: p95 of the server's time ≤ 200 ms.
const portalGoalMS = 200

// The loaded org: the org, portalTeams teams and portalMembers members under each (50
// accounts, 3 levels). Its events are at the members, one in fifty at a team.
const (
	portalOrg     = "por"
	portalTeams   = 7
	portalMembers = 6
)

// portalOptions are what the portal section loads and how often it reads.
type portalOptions struct {
	Events   int       // billing-log rows over the year
	Requests int       // timed reads of each kind
	Rounds   int       // samples of the read from the raw rows (the baseline)
	Now      time.Time // the year ends on its UTC day
}

// portalAccounts are the org and its children (the teams), and every account of the org.
func portalAccounts() (children, all []string) {
	children = []string{portalOrg}
	all = []string{portalOrg}
	for t := range portalTeams {
		team := fmt.Sprintf("%s-t%d", portalOrg, t)
		children, all = append(children, team), append(all, team)
		for m := range portalMembers {
			all = append(all, fmt.Sprintf("%s-m%d", team, m))
		}
	}
	return children, all
}

// portalBench is issue 33's proof of the portal's usage reads: a year of one org
// (PortalEvents billing-log rows) loaded through the billing log's triggers, then the
// reads of the customer API's usage page through billinglog.Daily, timed.
func (s *stack) portalBench(ctx context.Context, res *Results) error {
	return portalUsage(ctx, s.pool, portalOptions{Events: s.cfg.PortalEvents, Requests: s.cfg.PortalRequests,
		Rounds: s.cfg.Rounds, Now: time.Now().UTC()}, s.out, res)
}

// portalRead is one read of the usage page: accounts' days from From until before To,
// summed per account and month when ByMonth.
type portalRead struct {
	Name     string
	Accounts []string
	From, To time.Time
	ByMonth  bool
}

// readTiming is a read's timed samples, in ms.
type readTiming struct {
	Name string  `json:"name"`
	N    int     `json:"n"`
	Rows int     `json:"rows"` // days read
	P50  float64 `json:"p50_ms"`
	P95  float64 `json:"p95_ms"`
	Max  float64 `json:"max_ms"`
}

// portalUsage loads the year into pool's schema, then times each read o.Requests times,
// the reads in turn (their order rotated each round), and the current month by day of the
// org from billable_events' rows beside it, o.Rounds times: the baseline, and the check
// that both agree.
func portalUsage(ctx context.Context, pool *pgxpool.Pool, o portalOptions, out io.Writer, res *Results) error {
	raw := map[string]any{}
	res.Raw["portal"] = raw
	today := o.Now.Truncate(24 * time.Hour)
	loaded, err := loadPortalYear(ctx, pool, o.Events, today)
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	raw["load"] = loaded
	fmt.Fprintf(out, "  loaded %d events (%d outcomes, %d voids) of one org over 365 days through the triggers in %.1f s (%.0f events/s); analyzed in %.1f s\n",
		int(loaded["events"]), int(loaded["outcomes"]), int(loaded["voids"]), loaded["load_s"], loaded["events"]/loaded["load_s"], loaded["analyze_s"])

	children, all := portalAccounts()
	month := time.Date(today.Year(), today.Month(), 1, 0, 0, 0, 0, time.UTC)
	yearFrom, to := month.AddDate(-1, 1, 0), today.AddDate(0, 0, 1)
	reads := []portalRead{
		{"year_by_month_per_child", children, yearFrom, to, true},
		{"month_by_day_per_child", children, month, to, false},
		{"year_by_month_every_account", all, yearFrom, to, true},
	}
	samples := make([][]float64, len(reads))
	rows := make([]int, len(reads))
	for i := range o.Requests + consoleWarmups {
		for k := range reads {
			r := reads[(i+k)%len(reads)]
			begin := time.Now()
			n, err := portalSeries(ctx, pool, r)
			if err != nil {
				return fmt.Errorf("%s: %w", r.Name, err)
			}
			if i >= consoleWarmups {
				j := (i + k) % len(reads)
				samples[j] = append(samples[j], float64(time.Since(begin).Microseconds())/1e3)
				rows[j] = n
			}
		}
	}
	var timings []readTiming
	for i, r := range reads {
		s := samples[i]
		slices.Sort(s)
		t := readTiming{Name: r.Name, N: len(s), Rows: rows[i], P50: nearestRank(s, 50), P95: nearestRank(s, 95), Max: s[len(s)-1]}
		timings = append(timings, t)
		fmt.Fprintf(out, "  %-28s p50 %6.1f  p95 %6.1f  max %6.1f ms  n %3d  %5d days read (%d accounts)\n",
			t.Name, t.P50, t.P95, t.Max, t.N, t.Rows, len(r.Accounts))
		res.add("portal_usage_p95_ms_"+r.Name, t.P95, "ms", fmt.Sprintf("≤ %d", portalGoalMS),
			fmt.Sprintf("billinglog.Daily (usage_daily, migration 00028) of %d accounts from %s until %s%s, from the bench's process, %d reads after %d warm-ups, the %d reads in turn: p50 %.1f, max %.1f ms; %d days read; %.0f events of one org over 365 days",
				len(r.Accounts), r.From.Format(time.DateOnly), r.To.Format(time.DateOnly), map[bool]string{true: " summed per month", false: ""}[r.ByMonth],
				t.N, consoleWarmups, len(reads), t.P50, t.Max, t.Rows, loaded["events"]))
	}
	raw["reads"] = timings

	// The baseline: the org's current month by day summed from the billing log's rows, as
	// the console's chart read it before the rollup, which must say the same.
	var rawMS []float64
	for range o.Rounds {
		begin := time.Now()
		sums, err := portalRawMonth(ctx, pool, month, to)
		if err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		rawMS = append(rawMS, float64(time.Since(begin).Microseconds())/1e3)
		days, err := billinglog.Daily(ctx, pool, []string{portalOrg}, month, to)
		if err != nil {
			return err
		}
		rolled := map[string][5]int64{}
		for _, d := range days {
			rolled[d.Day.Format(time.DateOnly)] = [5]int64{d.Events, d.Requests, d.Tokens, d.Credits, d.CostMicros}
		}
		if fmt.Sprint(rolled) != fmt.Sprint(sums) {
			return fmt.Errorf("usage_daily is not the billing log summed: %v, billable_events %v", rolled, sums)
		}
	}
	slices.Sort(rawMS)
	rollup := timings[1].P50
	raw["baseline_ms"] = rawMS
	fmt.Fprintf(out, "  the org's month by day from billable_events' rows: median %.0f ms (%d samples), the same figures\n", nearestRank(rawMS, 50), len(rawMS))
	res.add("portal_usage_rollup_speedup", nearestRank(rawMS, 50)/rollup, "×", "",
		fmt.Sprintf("the org's current month by day summed from billable_events' rows (median of %d, %.0f ms) ÷ month_by_day_per_child's p50 through usage_daily (%.1f ms, %d accounts): the read the rollup replaces; both gave the same figures",
			len(rawMS), nearestRank(rawMS, 50), rollup, len(children)))
	res.add("portal_load_events_per_s", loaded["events"]/loaded["load_s"], "events/s", "",
		fmt.Sprintf("%.0f events, %.0f outcomes and %.0f voids of one org inserted a day at a time (INSERT … SELECT generate_series, the triggers of usage_daily on) in %.0f s",
			loaded["events"], loaded["outcomes"], loaded["voids"], loaded["load_s"]))
	return nil
}

// portalSeries makes r's series as the customer API would: the days of r's accounts,
// summed per account and month when r.ByMonth. It returns the days read.
func portalSeries(ctx context.Context, pool *pgxpool.Pool, r portalRead) (int, error) {
	days, err := billinglog.Daily(ctx, pool, r.Accounts, r.From, r.To)
	if err != nil {
		return 0, err
	}
	type key struct {
		account string
		start   time.Time
	}
	points := map[key][5]int64{}
	for _, d := range days {
		start := d.Day
		if r.ByMonth {
			start = time.Date(start.Year(), start.Month(), 1, 0, 0, 0, 0, time.UTC)
		}
		p := points[key{d.Account, start}]
		points[key{d.Account, start}] = [5]int64{p[0] + d.Events, p[1] + d.Requests, p[2] + d.Tokens, p[3] + d.Credits, p[4] + d.CostMicros}
	}
	if len(days) == 0 {
		return 0, errors.New("no usage")
	}
	return len(days), nil
}

// portalRawMonth sums the org's billable_events rows per UTC day from from until before to.
func portalRawMonth(ctx context.Context, pool *pgxpool.Pool, from, to time.Time) (map[string][5]int64, error) {
	rows, err := pool.Query(ctx, `
select (e.event_time at time zone 'UTC')::date::text, count(*), sum(e.billable_requests)::bigint, sum(e.billable_tokens)::bigint,
       sum(e.billable_credits)::bigint, sum(e.billable_cost_micros)::bigint
from billable_events e
where e.path @> array[@account::text] and e.event_time >= @from and e.event_time < @to and e.billing_period >= @from::date
group by 1`, pgx.StrictNamedArgs{"account": portalOrg, "from": from, "to": to})
	if err != nil {
		return nil, err
	}
	out := map[string][5]int64{}
	var day string
	var v [5]int64
	_, err = pgx.ForEachRow(rows, []any{&day, &v[0], &v[1], &v[2], &v[3], &v[4]}, func() error {
		out[day] = v
		return nil
	})
	return out, err
}

// loadPortalYear writes events admissions of the org over the 365 UTC days up to today
// (today's until now), a day at a time, each day in three statements through the
// triggers of usage_daily (a day's are more rows than a transaction locks one by one: each
// takes the writers' lock instead, as a bulk load does): its admissions, an outcome for
// one in four (one in ten of them a 503, the others with actual tokens), a void for one
// in 997. It then analyzes the tables.
func loadPortalYear(ctx context.Context, pool *pgxpool.Pool, events int, today time.Time) (map[string]float64, error) {
	first := today.AddDate(0, 0, -364)
	for m := time.Date(first.Year(), first.Month(), 1, 0, 0, 0, 0, time.UTC); !m.After(today); m = m.AddDate(0, 1, 0) {
		if _, err := pool.Exec(ctx, `select usage_events_partition($1::date)`, m); err != nil {
			return nil, err
		}
	}
	stats := map[string]float64{}
	begin := time.Now()
	for d := range 365 {
		lo, hi := events*d/365+1, events*(d+1)/365 // the day's events: lo..hi
		if hi < lo {
			continue
		}
		day := first.AddDate(0, 0, d)
		end := day.AddDate(0, 0, 1)
		if now := time.Now().UTC(); now.Before(end) {
			end = now // today's events until now
		}
		span := pgx.StrictNamedArgs{"lo": lo, "hi": hi, "t1": end}
		for _, q := range []struct {
			name, sql string
			args      pgx.StrictNamedArgs
		}{
			{"events", `
insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path, source,
  requests, tokens, credits, cost_micros, kafka_partition, kafka_offset)
select 'por-' || i, date_trunc('month', t at time zone 'UTC')::date, t, date_trunc('month', t at time zone 'UTC')::date,
  @org::text, p[cardinality(p)], case cardinality(p) when 2 then 'team' else 'user' end, p, 'bench',
  1, 500 + i % 3000, i % 4, 1000 + i % 50000, i % 12, i
from generate_series(@lo::bigint, @hi::bigint) i
cross join lateral (select @t0::timestamptz + (@t1::timestamptz - @t0::timestamptz) * ((i - @lo::bigint)::float8 / (@hi::bigint - @lo::bigint + 1)) as t) x
cross join lateral (select case when i % 50 = 0 then array[@org::text, @org::text || '-t' || i % @teams::int]
  else array[@org::text, @org::text || '-t' || i % @teams::int, @org::text || '-t' || i % @teams::int || '-m' || i / @teams::int % @members::int] end as p) y`,
				pgx.StrictNamedArgs{"org": portalOrg, "lo": lo, "hi": hi, "t0": day, "t1": end, "teams": portalTeams, "members": portalMembers}},
			{"outcomes", `
insert into usage_outcomes (event_id, status, tokens, outcome_time, source, kafka_partition, kafka_offset)
select 'por-' || i, case when i % 40 = 0 then 503 else 200 end, case when i % 40 <> 0 then 400 + i % 2000 end, @t1::timestamptz,
  'bench', i % 12, i
from generate_series(@lo::bigint, @hi::bigint) i where i % 4 = 0`, span},
			{"voids", `
insert into usage_voids (event_id, attempt, reason, void_time, source, kafka_partition, kafka_offset)
select 'por-' || i, 'por-' || i, 'caller_gone', @t1::timestamptz, 'bench', i % 12, i
from generate_series(@lo::bigint, @hi::bigint) i where i % 997 = 0`, span},
		} {
			tag, err := pool.Exec(ctx, q.sql, q.args)
			if err != nil {
				return nil, fmt.Errorf("%s of %s: %w", q.name, day.Format(time.DateOnly), err)
			}
			stats[q.name] += float64(tag.RowsAffected())
		}
	}
	stats["load_s"] = time.Since(begin).Seconds()
	begin = time.Now()
	for _, q := range []string{"analyze usage_events, usage_outcomes, usage_voids", "vacuum (analyze) usage_daily_totals, usage_daily_changes"} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("%s: %w", q, err)
		}
	}
	stats["analyze_s"] = time.Since(begin).Seconds()
	return stats, nil
}
