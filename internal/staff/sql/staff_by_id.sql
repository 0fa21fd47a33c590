-- Staff member @id, revoked or not (the columns of list_staff.sql).
select id, name, role, created_at, created_by, revoked_at, coalesce(revoked_by, '')
from staff
where id = @id
