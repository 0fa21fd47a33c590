-- Customer token @id, live or not (the columns of list_tokens.sql).
select id, account, org, scopes, name, created_at, created_by, expires_at, revoked_at, coalesce(revoked_by, '')
from customer_tokens
where id = @id
