-- Records account @account's override of @unit (a limit's columns: limitArgs).
insert into account_limits (account, unit, algorithm, rate_per_s, burst, "limit", window_s, quota, quota_period, ceiling)
values (@account, @unit, @algorithm, @rate_per_s, @burst, @limit, @window_s, @quota, @quota_period, @ceiling)
