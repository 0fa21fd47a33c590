-- Records plan @plan's limit of @unit (a limit's columns: limitArgs).
insert into plan_limits (plan, unit, algorithm, rate_per_s, burst, "limit", window_s, quota, quota_period, ceiling)
values (@plan, @unit, @algorithm, @rate_per_s, @burst, @limit, @window_s, @quota, @quota_period, @ceiling)
