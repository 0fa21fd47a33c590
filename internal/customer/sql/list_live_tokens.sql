-- The live customer tokens (neither revoked nor expired) of org @org and account @account
-- (null: any), newest first (the columns of list_tokens.sql).
select id, account, org, scopes, name, created_at, created_by, expires_at, revoked_at, coalesce(revoked_by, '')
from customer_tokens
where (@org::text is null or org = @org)
  and (@account::text is null or account = @account)
  and revoked_at is null
  and expires_at > now()
order by created_at desc, id desc
