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

	"github.com/metergate/metergate/pkg/period"
	"github.com/metergate/metergate/pkg/policy"
)

// driftCorrections compares every monthly counter that the billing log has usage for in
// the open periods with its billable total (asCorrected: see billableCounters). planned adds
// not-yet-applied deltas to the counters read (a dry run); failOpenBefore, when set, leaves
// out fail-open events ingested after it. It returns a restore for each counter below its
// total, and every counter that differs.
func driftCorrections(ctx context.Context, o Options, from time.Time, planned map[string]int64, asCorrected bool, failOpenBefore *time.Time) ([]Adjustment, []Difference, error) {
	counters, err := billableCounters(ctx, o, from, asCorrected, failOpenBefore)
	if err != nil {
		return nil, nil, err
	}

	// One GET per counter, pipelined (keys of several slots: no MGET on a cluster).
	const batch = 500
	for start := 0; start < len(counters); start += batch {
		end := min(start+batch, len(counters))
		pipe := o.Redis.Pipeline()
		cmds := make([]*redis.StringCmd, end-start)
		for i := range cmds {
			cmds[i] = pipe.Get(ctx, counters[start+i].key)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, nil, fmt.Errorf("read counters: %w", err)
		}
		for i, cmd := range cmds {
			v, err := cmd.Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, nil, fmt.Errorf("read counter %s: %w", counters[start+i].key, err)
			}
			counters[start+i].Redis = v + planned[counters[start+i].key]
		}
	}

	var (
		restores []Adjustment
		diffs    []Difference
	)
	for _, c := range counters {
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
	return restores, diffs, nil
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
			totals       []int64
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
			counters = append(counters, counter{
				Difference: Difference{Org: org, Account: account, Level: lv.Kind, Unit: u, QuotaPeriod: window, Period: p, Billable: totals[unitIndex(u)]},
				key:        o.Keys.Quota(org, account, u, p),
			})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read billable totals: %w", err)
	}

	return counters, nil
}

// strayCounters lists the quota counters of the open periods that are not in checked and
// hold a value other than 0: each is a difference from a billable total of 0.
func strayCounters(ctx context.Context, o Options, from time.Time, checked map[string]bool) ([]Difference, error) {
	var labels []string
	for m := from; !m.After(o.now); m = m.AddDate(0, 1, 0) {
		labels = append(labels, period.MonthLabel(m))
	}
	for d := sinceDay(o.now); !d.After(o.now); d = d.AddDate(0, 0, 1) {
		labels = append(labels, period.DayLabel(d))
	}
	var out []Difference
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
				v, err := c.Get(ctx, key).Int64()
				if errors.Is(err, redis.Nil) || (err == nil && v == 0) {
					continue
				}
				if err != nil {
					return fmt.Errorf("read counter %s: %w", key, err)
				}
				d := Difference{Account: account, Unit: unit, QuotaPeriod: policy.KindOf(keyLabel), Period: keyLabel, Redis: v}
				if pol, err := o.Policies.Resolve(account); err == nil {
					d.Org, d.Level = pol.Org, pol.Path[len(pol.Path)-1].Kind
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
		return out, err
	}
	return out, scan(ctx, o.Redis)
}
