package reconcile

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

// driftCorrections compares every monthly counter that the billing log has usage for in
// the open periods with its billable total (asCorrected: see billableCounters). planned adds
// not-yet-applied deltas to the counters read (a dry run); failOpenBefore, when set, leaves
// out fail-open events ingested after it. It returns a restore for each counter below its
// total, every counter that differs, and the problems of counters it could not compare (a
// value that is not an integer within ±keyspace.MaxCounter, a total past it): those are
// skipped, the others compared.
func driftCorrections(ctx context.Context, o Options, from time.Time, planned map[string]int64, asCorrected bool, failOpenBefore *time.Time) ([]Adjustment, []Difference, []Problem, error) {
	all, err := billableCounters(ctx, o, from, asCorrected, failOpenBefore)
	if err != nil {
		return nil, nil, nil, err
	}
	var problems []Problem
	counters := all[:0:0]
	for _, c := range all {
		if c.bad != nil {
			problems = append(problems, *c.bad)
			continue
		}
		counters = append(counters, c)
	}

	// One GET per counter, pipelined (keys of several slots: no MGET on a cluster).
	const batch = 500
	read := counters[:0:0]
	for start := 0; start < len(counters); start += batch {
		end := min(start+batch, len(counters))
		pipe := o.Redis.Pipeline()
		cmds := make([]*redis.StringCmd, end-start)
		for i := range cmds {
			cmds[i] = pipe.Get(ctx, counters[start+i].key)
		}
		_, _ = pipe.Exec(ctx) // each command's error is looked at below
		for i, cmd := range cmds {
			c := counters[start+i]
			v, p, err := counterValue(cmd)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("read counter %s: %w", c.key, err)
			}
			if p != nil {
				p.Org, p.Account, p.Unit, p.Period, p.Key = c.Org, c.Account, c.Unit, c.Period, c.key
				problems = append(problems, *p)
				continue
			}
			c.Redis = v + planned[c.key]
			read = append(read, c)
		}
	}

	var (
		restores []Adjustment
		diffs    []Difference
	)
	for _, c := range read {
		if c.Redis == c.Billable {
			continue
		}
		diffs = append(diffs, c.Difference)
		if c.Redis < c.Billable {
			restores = append(restores, Adjustment{Kind: DriftRestore, Org: c.Org, Account: c.Account, Level: c.Level,
				Unit: c.Unit, QuotaPeriod: c.QuotaPeriod, Period: c.Period, Amount: c.Billable - c.Redis,
				Reason: fmt.Sprintf("counter %d below billable total %d", c.Redis, c.Billable)})
		}
	}
	return restores, diffs, problems, nil
}

// counterValue reads a counter's GET: 0 when it is missing, a BadCounter problem (without
// its place, which the caller fills in) when Redis holds something other than an integer
// within ±keyspace.MaxCounter there, and an error only when Redis could not be read.
func counterValue(cmd *redis.StringCmd) (int64, *Problem, error) {
	raw, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, nil, nil
	case err != nil && perAccount(err):
		return 0, &Problem{Kind: BadCounter, Error: err.Error()}, nil
	case err != nil:
		return 0, nil, err
	}
	v, err := parseCounter(raw)
	if err != nil {
		return 0, &Problem{Kind: BadCounter, Value: rawValue(raw), Error: err.Error()}, nil
	}
	return v, nil, nil
}

// The billable totals of the quota counters: as billed (verify) and as the corrections
// recorded so far leave them (drift).
// Each is its events' CTE followed by the totals both share.
var (
	//go:embed sql/billable_as_billed.sql
	billableAsBilledEvents string
	//go:embed sql/billable_as_corrected.sql
	billableAsCorrectedEvents string
	//go:embed sql/billable_totals.sql
	billableTotals string

	billableAsBilledSQL    = billableAsBilledEvents + billableTotals
	billableAsCorrectedSQL = billableAsCorrectedEvents + billableTotals
)

// counter is a quota counter with its billable total (Billable) and, once read, its value.
type counter struct {
	Difference
	key string
	bad *Problem // the billable total is past keyspace.MaxCounter: reported, not compared
}

// billableCounters lists every quota counter of the open periods (months and days) that the
// billing log has usage for, with its billable total.
//
// With asCorrected, the total is what the counter must hold given the corrections recorded
// so far: drift is then only what Redis lost. An outcome or a boundary event metered after
// this run computed its event corrections is left to the next run's refund, settlement or
// move, and is not restored as drift first (which would count it twice); failOpenBefore,
// when set, leaves out fail-open events ingested after it. Without asCorrected, the total is
// the one billed (sql/billable_as_billed.sql) and failOpenBefore does not apply.
func billableCounters(ctx context.Context, o Options, from time.Time, asCorrected bool, failOpenBefore *time.Time) ([]counter, error) {
	// The two totals are two queries, chosen here: no switch in SQL.
	query, args := billableAsBilledSQL, pgx.StrictNamedArgs{"since": from, "since_day": sinceDay(o.now)}
	if asCorrected {
		// Without a cutoff no fail-open event is left out: every ingest time is before infinity.
		before := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
		if failOpenBefore != nil {
			before = pgtype.Timestamptz{Time: *failOpenBefore, Valid: true}
		}
		query, args["fail_open_before"] = billableAsCorrectedSQL, before
	}
	rows, err := o.Pool.Query(ctx, query, args)
	if err != nil {
		return nil, fmt.Errorf("read billable totals: %w", err)
	}
	var counters []counter
	for rows.Next() {
		var (
			org, account string
			window       policy.QuotaPeriod
			period       time.Time
			totals       []string // numeric sums, as text: one may be past bigint
		)
		if err := rows.Scan(&org, &account, &window, &period, &totals); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read billable totals: %w", err)
		}
		pol, err := o.Policies.Resolve(account)
		if err != nil {
			continue
		}
		lv := pol.Path[len(pol.Path)-1]
		for _, u := range quotas(lv, window) {
			p := window.Label(period)
			c := counter{
				Difference: Difference{Org: org, Account: account, Level: lv.Kind, Unit: u, QuotaPeriod: window, Period: p},
				key:        o.Keys.Quota(org, account, u, p),
			}
			raw := totals[unitIndex(u)]
			if c.Billable, err = parseTotal(raw); err != nil {
				c.bad = &Problem{Kind: BadTotal, Org: org, Account: account, Unit: u, Period: p, Key: c.key,
					Value: rawValue(raw), Error: err.Error()}
			}
			counters = append(counters, c)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read billable totals: %w", err)
	}

	return counters, nil
}

// strayCounters lists the quota counters of the open periods that are not in checked and
// hold a value other than 0: each is a difference from a billable total of 0, or a problem
// when it holds no integer within ±keyspace.MaxCounter.
func strayCounters(ctx context.Context, o Options, from time.Time, checked map[string]bool) ([]Difference, []Problem, error) {
	var labels []string
	for m := from; !m.After(o.now); m = m.AddDate(0, 1, 0) {
		labels = append(labels, period.MonthLabel(m))
	}
	for d := sinceDay(o.now); !d.After(o.now); d = d.AddDate(0, 0, 1) {
		labels = append(labels, period.DayLabel(d))
	}
	var (
		out      []Difference
		problems []Problem
	)
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		for _, label := range labels {
			iter := c.Scan(ctx, 0, o.Keys.QuotaPattern(label), 1000).Iterator()
			for iter.Next(ctx) {
				key := iter.Val()
				if checked[key] {
					continue
				}
				account, unit, keyLabel, ok := o.Keys.ParseQuota(key)
				if !ok {
					continue // not a quota counter of this prefix
				}
				v, p, err := counterValue(c.Get(ctx, key))
				if err != nil {
					return fmt.Errorf("read counter %s: %w", key, err)
				}
				if p == nil && v == 0 {
					continue
				}
				d := Difference{Account: account, Unit: unit, QuotaPeriod: policy.KindOf(keyLabel), Period: keyLabel, Redis: v}
				if pol, err := o.Policies.Resolve(account); err == nil {
					d.Org, d.Level = pol.Org, pol.Path[len(pol.Path)-1].Kind
				}
				if p != nil {
					p.Org, p.Account, p.Unit, p.Period, p.Key = d.Org, account, unit, keyLabel, key
					problems = append(problems, *p)
					continue
				}
				out = append(out, d)
			}
			if err := iter.Err(); err != nil {
				return fmt.Errorf("scan counters: %w", err)
			}
		}
		return nil
	}
	if cc, ok := o.Redis.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock() // out is shared; masters are few
			defer mu.Unlock()
			return scan(ctx, c)
		})
		return out, problems, err
	}
	err := scan(ctx, o.Redis)
	return out, problems, err
}
