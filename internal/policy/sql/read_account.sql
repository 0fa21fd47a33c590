-- Account @id as stored (its overrides: read_account_limits.sql); no row if there is none.
select id, kind, coalesce(parent, ''), org, coalesce(plan, ''), concurrency, priority, shadow, created_at, updated_at
from accounts
where id = @id
