package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
// move, and is not restored as drift first (which would count it twice).
func billableCounters(ctx context.Context, o Options, from time.Time, asCorrected bool, failOpenBefore *time.Time) ([]counter, error) {
	// asCorrected: an event of a counter that can lose nothing (not fail-open) counts as the
	// corrections recorded so far have left it (moved or not, refunded or not, settled or
	// not); otherwise as billed (event time's month, 5xx nothing, actual units).
	// As in eventCorrections, each event looks its outcome up by key. OFFSET 0 keeps z a
	// subquery evaluated once per event: flattened, its lookups in adjustments are repeated in
	// each of the four sums, or replaced by a hash of every correction of a kind ever recorded.
	rows, err := o.Pool.Query(ctx, `
with x as (
  select e.org, e.path, z.period, date_trunc('day', e.event_time at time zone 'UTC') as day,
         case when z.zero then 0 when z.actual then coalesce(o.requests, e.requests) else e.requests end as requests,
         case when z.zero then 0 when z.actual then coalesce(o.tokens, e.tokens) else e.tokens end as tokens,
         case when z.zero then 0 when z.actual then coalesce(o.credits, e.credits) else e.credits end as credits,
         case when z.zero then 0 when z.actual then coalesce(o.cost_micros, e.cost_micros) else e.cost_micros end as cost_micros
  from usage_events e
  left join lateral (select * from usage_outcomes o where o.event_id = e.event_id limit 1) o on true
  left join usage_voids v on v.event_id = e.event_id
  cross join lateral (select $2::boolean and not e.fail_open as corrected) c
  cross join lateral (select
      case when not c.corrected then coalesce(o.status >= 500, false) or v.event_id is not null
           else exists (select 1 from adjustments a where a.kind in ('refund_5xx', 'refund_void') and a.source_event = e.event_id) end as zero,
      case when not c.corrected then true
           else exists (select 1 from adjustments a where a.kind = 'settle_tokens' and a.source_event = e.event_id) end as actual,
      case when not c.corrected or e.charged_period = e.billing_period
             or exists (select 1 from adjustments a where a.kind = 'period_move' and a.source_event = e.event_id)
           then e.billing_period else e.charged_period end as period
      offset 0) z
  where e.billing_period >= $1 and (not e.fail_open or $4::timestamptz is null or e.ingest_time < $4)
)
select x.org, lvl.account, 'month', x.period::timestamp,
       array[sum(x.requests), sum(x.tokens), sum(x.credits), sum(x.cost_micros)]::bigint[]
from x cross join lateral unnest(x.path) as lvl(account)
where x.period >= $1
group by 1, 2, 3, 4
union all
select x.org, lvl.account, 'day', x.day,
       array[sum(x.requests), sum(x.tokens), sum(x.credits), sum(x.cost_micros)]::bigint[]
from x cross join lateral unnest(x.path) as lvl(account)
where x.day >= $3
group by 1, 2, 3, 4
order by 1, 2, 3, 4`, from, asCorrected, sinceDay(o.Now), failOpenBefore)
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
	for m := from; !m.After(o.Now); m = m.AddDate(0, 1, 0) {
		labels = append(labels, period.MonthLabel(m))
	}
	for d := sinceDay(o.Now); !d.After(o.Now); d = d.AddDate(0, 0, 1) {
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
