-- A page of the audit log, newest first: entries before the id @before, of the actor
-- @actor (null: every actor), at most @limit.
select id, at, actor, role, method, route, path, status, before, after
from audit_log
where id < @before
  and (@actor::text is null or actor = @actor)
order by id desc
limit @limit
