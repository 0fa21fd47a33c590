-- Every account, for the cache (their overrides: load_account_limits.sql).
select id, kind, coalesce(parent, ''), org, coalesce(plan, ''), concurrency, priority, shadow from accounts
