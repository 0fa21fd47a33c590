-- API key @id, revoked or not; no row if there is none.
select id, account, created_at, revoked_at
from api_keys
where id = @id
