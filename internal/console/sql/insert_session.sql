-- A new console session of @staff_id as @role, ending at @expires_at.
insert into console_sessions (id_hash, staff_id, role, csrf, expires_at)
values (@id_hash, @staff_id, @role, @csrf, @expires_at)
returning created_at
