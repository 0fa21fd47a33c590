-- Every customer token of org @org and account @account (null: any), revoked and expired
-- ones too, newest first.
select id, account, org, scopes, name, created_at, created_by, expires_at, revoked_at, coalesce(revoked_by, '')
from customer_tokens
where (@org::text is null or org = @org)
  and (@account::text is null or account = @account)
order by created_at desc, id desc
