-- The live (not revoked) staff member whose token has the SHA-256 @token_hash.
select id, name, role, created_at, created_by
from staff
where token_hash = @token_hash and revoked_at is null
