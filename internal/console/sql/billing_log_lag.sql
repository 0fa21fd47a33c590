-- How far the billing log lags behind admissions, over its rows of admissions since
-- @since, the first @limit of them at most (a bounded sample, however busy the log): how
-- many, the median and 95th percentile of ingest_time - event_time in seconds, and the
-- newest event_time among them. billing_period prunes the partitions, the BRIN index on
-- event_time bounds the scan, and the limit stops it.
select count(*),
       coalesce(percentile_cont(0.5) within group (order by extract(epoch from ingest_time - event_time)), 0)::float8,
       coalesce(percentile_cont(0.95) within group (order by extract(epoch from ingest_time - event_time)), 0)::float8,
       max(event_time)
from (
    select event_time, ingest_time
    from usage_events
    where billing_period >= date_trunc('month', @since::timestamptz at time zone 'UTC')::date
      and event_time >= @since
    limit @limit
) recent
