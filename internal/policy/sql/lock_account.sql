-- Account @id as read_account.sql reads it, locked for its update; no row if there is none.
select id, kind, coalesce(parent, ''), org, coalesce(plan, ''), concurrency, priority, shadow, created_at, updated_at
from accounts
where id = @id
for update
