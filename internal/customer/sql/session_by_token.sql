-- The portal session whose opening made customer token @token_id (the columns of
-- insert_session.sql).
select id, account, org, scopes, return_url, created_at, created_by, expires_at, opened_at, token_id
from portal_sessions
where token_id = @token_id
