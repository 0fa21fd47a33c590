-- Every account's overrides, one row per account and unit, the limit's columns in limitRow.dest's order.
select account, unit, algorithm, rate_per_s, burst, "limit", window_s, quota, quota_period, ceiling
from account_limits
