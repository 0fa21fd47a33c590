-- How far the billing log lags behind admissions, over the rows of admissions since @since:
-- how many, and the median and 95th percentile of ingest_time - event_time in seconds.
-- billing_period prunes the partitions, the BRIN index on event_time bounds the scan.
select count(*),
       coalesce(percentile_cont(0.5) within group (order by extract(epoch from ingest_time - event_time)), 0)::float8,
       coalesce(percentile_cont(0.95) within group (order by extract(epoch from ingest_time - event_time)), 0)::float8
from usage_events
where billing_period >= date_trunc('month', @since::timestamptz at time zone 'UTC')::date
  and event_time >= @since
