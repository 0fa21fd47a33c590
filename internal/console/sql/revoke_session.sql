-- Ends the live session whose id hash is @id_hash; no row when there is none.
update console_sessions
set revoked_at = now()
where id_hash = @id_hash and revoked_at is null and expires_at > now()
returning staff_id
