-- Add staff member @name with @role and the SHA-256 of its token.
insert into staff (id, name, role, token_hash, created_by)
values (@id, @name, @role, @token_hash, @created_by)
returning created_at
