-- Replaces the rank, concurrency, priority and shadow flag of plan @id (its limits and grants: writePlanRest).
update plans set rank = @rank, concurrency = @concurrency, priority = @priority, shadow = @shadow
where id = @id
