-- Revoke customer token @id (once), by @revoked_by: it is refused from then on.
update customer_tokens set revoked_at = now(), revoked_by = @revoked_by
where id = @id and revoked_at is null
returning id, account, org, scopes, name, created_at, created_by, expires_at, revoked_at, coalesce(revoked_by, '')
