-- Every plan's limits, one row per plan and unit, the limit's columns in limitRow.dest's order.
select plan, unit, algorithm, rate_per_s, burst, "limit", window_s, quota, quota_period, ceiling
from plan_limits
