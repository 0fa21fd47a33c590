-- The live sessions, newest first, with their member's name.
select s.id_hash, s.staff_id, coalesce(st.name, s.staff_id), s.role, s.created_at, s.expires_at
from console_sessions s
left join staff st on st.id = s.staff_id
where s.revoked_at is null
  and s.expires_at > now()
  and (s.staff_id = @admin_token or (st.id is not null and st.revoked_at is null))
order by s.created_at desc
limit 500
