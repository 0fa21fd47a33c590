-- Revokes API key @id; revoking it again keeps the first revocation time.
update api_keys set revoked_at = coalesce(revoked_at, now()) where id = @id
