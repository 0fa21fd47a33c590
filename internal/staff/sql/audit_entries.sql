-- A page of the audit log, newest first: entries before the id @before, at most @limit.
select id, at, actor, role, method, route, path, status, before, after
from audit_log
where id < @before
order by id desc
limit @limit
