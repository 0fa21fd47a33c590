-- Open the portal session whose link's code hashes to @code_hash, once: only while it is
-- unopened and unexpired, and its account still there in its org; it records the customer
-- token @token_id its opening makes (the columns of insert_session.sql). No row for any
-- other code. The row lock makes a second, concurrent opening wait and then find it opened.
update portal_sessions s set opened_at = now(), token_id = @token_id
from accounts a
where s.code_hash = @code_hash
  and s.opened_at is null
  and s.expires_at > now()
  and a.id = s.account and a.org = s.org
returning s.id, s.account, s.org, s.scopes, s.return_url, s.created_at, s.created_by, s.expires_at, s.opened_at,
          s.token_id
