-- Admissions of every org per minute since @since, from the billing log: the minute
-- (truncated, UTC), how many rows, and the newest event_time in it. billing_period prunes
-- the partitions, the BRIN index on event_time bounds the scan.
select date_trunc('minute', event_time at time zone 'UTC') as minute, count(*), max(event_time)
from usage_events
where billing_period >= date_trunc('month', @since::timestamptz at time zone 'UTC')::date
  and event_time >= @since
group by 1
order by 1
