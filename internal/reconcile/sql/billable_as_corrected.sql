-- The total of every quota counter of the open periods (months from @since, days from
-- @since_day) that the billing log has usage for, as the counter must hold it given the
-- corrections recorded so far: what drift is measured against. An event that charged a
-- counter (not fail-open) counts as its recorded corrections have left it (moved or not,
-- refunded or not, settled or not); a fail-open event, which charged none, counts as billed
-- (billable_as_billed.sql). Fail-open events ingested at or after @fail_open_before are
-- left out ('infinity': none is).
--
-- Each event looks up its outcome by key, as in event_corrections.sql. OFFSET 0 keeps z a
-- subquery evaluated once per event: flattened, its lookups in adjustments are repeated in
-- each of the four sums, or replaced by a hash of every correction of a kind ever recorded.
with x as (
  select e.org, e.path, z.period, date_trunc('day', e.event_time at time zone 'UTC') as day,
         billable_units(e.requests, case when z.actual then o.requests end, z.zero) as requests,
         billable_units(e.tokens, case when z.actual then o.tokens end, z.zero) as tokens,
         billable_units(e.credits, case when z.actual then o.credits end, z.zero) as credits,
         billable_units(e.cost_micros, case when z.actual then o.cost_micros end, z.zero) as cost_micros
  from usage_events e
  left join lateral (select * from usage_outcomes o where o.event_id = e.event_id limit 1) o on true
  left join usage_voids v on v.event_id = e.event_id
  cross join lateral (select
      case when e.fail_open then bills_nothing(o.status, v.event_id is not null)
           else exists (select 1 from adjustments a where a.kind in ('refund_5xx', 'refund_void') and a.source_event = e.event_id) end as zero,
      case when e.fail_open then true
           else exists (select 1 from adjustments a where a.kind = 'settle_tokens' and a.source_event = e.event_id) end as actual,
      case when e.fail_open or e.charged_period = e.billing_period
             or exists (select 1 from adjustments a where a.kind = 'period_move' and a.source_event = e.event_id)
           then e.billing_period else e.charged_period end as period
      offset 0) z
  where e.billing_period >= @since and (not e.fail_open or e.ingest_time < @fail_open_before)
)
-- The totals: billable_totals.sql, appended.
