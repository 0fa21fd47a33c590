-- Record a write through the admin API: who, with which role, the route, path and reply
-- status, and what it changed.
insert into audit_log (actor, role, method, route, path, status, before, after)
values (@actor, @role, @method, @route, @path, @status, @before, @after)
returning id, at
