-- Every plan (their limits: load_plan_limits.sql).
select id, rank, concurrency, priority, shadow from plans
