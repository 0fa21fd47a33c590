-- Every staff member, revoked ones too, oldest first.
select id, name, role, created_at, created_by, revoked_at, coalesce(revoked_by, '')
from staff
order by created_at, id
