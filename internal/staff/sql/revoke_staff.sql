-- Revoke staff member @id (once): its token is refused from then on.
update staff set revoked_at = now(), revoked_by = @revoked_by
where id = @id and revoked_at is null
returning revoked_at
