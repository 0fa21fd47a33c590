-- Make portal session @id of account @account, in the account's org, with @scopes and
-- @return_url, its link's code hashed @code_hash, openable for @ttl_us microseconds from
-- now; no row when there is no account @account.
insert into portal_sessions (id, account, org, scopes, return_url, code_hash, created_by, expires_at)
select @id::text, a.id, a.org, @scopes::text[], @return_url::text, @code_hash::bytea, @created_by::text,
       now() + @ttl_us::bigint * interval '1 microsecond'
from accounts a
where a.id = @account
returning id, account, org, scopes, return_url, created_at, created_by, expires_at, opened_at, token_id
