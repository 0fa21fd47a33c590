-- Forgets sessions that ended (expired or revoked) more than a day ago.
delete from console_sessions
where coalesce(revoked_at, expires_at) < now() - interval '1 day'
