-- The live session whose cookie id has the SHA-256 @id_hash: neither expired nor revoked,
-- and its staff member not revoked (the admin token's sessions have no staff row), with
-- the member's name.
select s.staff_id, coalesce(st.name, s.staff_id), s.role, s.csrf, s.created_at, s.expires_at
from console_sessions s
left join staff st on st.id = s.staff_id
where s.id_hash = @id_hash
  and s.revoked_at is null
  and s.expires_at > now()
  and (s.staff_id = @admin_token or (st.id is not null and st.revoked_at is null))
