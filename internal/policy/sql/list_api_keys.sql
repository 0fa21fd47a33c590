-- The API keys of account @account, newest first, at most @limit.
select id, account, created_at, revoked_at
from api_keys
where account = @account
order by created_at desc, id
limit @limit
