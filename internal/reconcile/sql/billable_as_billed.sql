-- The billable total of every quota counter of the open periods (months from @since, days
-- from @since_day) that the billing log has usage for: per org, level of the path, window
-- and period, what the events of the period (by event time) bill (billable_events,
-- migrations/00009_billable.sql). What verify compares the counters with.
with x as (
  select b.org, b.path, b.billing_period as period, date_trunc('day', b.event_time at time zone 'UTC') as day,
         b.billable_requests as requests, b.billable_tokens as tokens,
         b.billable_credits as credits, b.billable_cost_micros as cost_micros
  from billable_events b
  where b.billing_period >= @since
)
-- The totals: billable_totals.sql, appended.
