-- Issue token @id of account @account, in the account's org, with @scopes, living @ttl_us
-- microseconds from now; no row when there is no account @account.
insert into customer_tokens (id, account, org, scopes, token_hash, name, created_by, expires_at)
select @id::text, a.id, a.org, @scopes::text[], @token_hash::bytea, @name::text, @created_by::text,
       now() + @ttl_us::bigint * interval '1 microsecond'
from accounts a
where a.id = @account
returning id, account, org, scopes, name, created_at, created_by, expires_at, revoked_at, coalesce(revoked_by, '')
