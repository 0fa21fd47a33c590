-- The billable total of every quota counter of the open periods (months from @since, days
-- from @since_day) that the billing log has usage for: per org, level of the path, window
-- and period, the units of the events of the period (by event time), with the outcome's
-- actual units in place of the estimate where reported, and nothing for a request whose
-- outcome was a 5xx or that was voided. What verify compares the counters with.
--
-- Each event looks up its outcome by key, as in event_corrections.sql.
with x as (
  select e.org, e.path, e.billing_period as period, date_trunc('day', e.event_time at time zone 'UTC') as day,
         case when z.zero then 0 else coalesce(o.requests, e.requests) end as requests,
         case when z.zero then 0 else coalesce(o.tokens, e.tokens) end as tokens,
         case when z.zero then 0 else coalesce(o.credits, e.credits) end as credits,
         case when z.zero then 0 else coalesce(o.cost_micros, e.cost_micros) end as cost_micros
  from usage_events e
  left join lateral (select * from usage_outcomes o where o.event_id = e.event_id limit 1) o on true
  left join usage_voids v on v.event_id = e.event_id
  cross join lateral (select coalesce(o.status >= 500, false) or v.event_id is not null as zero) z
  where e.billing_period >= @since
)
-- The totals: billable_totals.sql, appended.
