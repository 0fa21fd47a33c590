-- The overrides of account @account, one row per unit, the limit's columns in limitRow.dest's order.
select unit, algorithm, rate_per_s, burst, "limit", window_s, quota, quota_period, ceiling
from account_limits
where account = @account
