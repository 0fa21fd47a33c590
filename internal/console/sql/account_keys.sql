-- The API keys of account @account, newest first.
select id, created_at, revoked_at
from api_keys
where account = @account
order by created_at desc
limit 200
