-- The live customer token whose SHA-256 is @token_hash: not revoked, not expired, and its
-- account still there, in the token's org (the columns of list_tokens.sql).
select t.id, t.account, t.org, t.scopes, t.name, t.created_at, t.created_by, t.expires_at, t.revoked_at,
       coalesce(t.revoked_by, '')
from customer_tokens t
join accounts a on a.id = t.account and a.org = t.org
where t.token_hash = @token_hash
  and t.revoked_at is null
  and t.expires_at > now()
