-- The adjustments of reconcile run @run_id with an id above @after, in the order it made
-- them, at most @limit. Materialized: the run's rows are found by adjustments_run_idx and
-- then sorted, rather than the whole table walked by id for them.
with run as materialized (
  select id, kind, org, account, level, unit, quota_period, period, amount, redis_before, redis_after,
         reason, source_event, created_at, applied_at
  from adjustments
  where run_id = @run_id::uuid and id > @after
)
select id, kind, org, account, level, unit, quota_period, period, amount, redis_before, redis_after,
       reason, coalesce(source_event, ''), created_at, applied_at
from run
order by id
limit @limit
