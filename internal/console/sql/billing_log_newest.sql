-- The newest event_time of the billing log since @since (null when none): how old its
-- newest row is. billing_period prunes the partitions, the BRIN index on event_time bounds
-- the scan.
select max(event_time)
from usage_events
where billing_period >= date_trunc('month', @since::timestamptz at time zone 'UTC')::date
  and event_time >= @since
