-- The limits of plan @plan, one row per unit, the limit's columns in limitRow.dest's order.
select unit, algorithm, rate_per_s, burst, "limit", window_s, quota, quota_period, ceiling
from plan_limits
where plan = @plan
