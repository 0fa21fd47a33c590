-- The children of account @parent after @after by id, at most @limit, as stored (their
-- overrides are not read: a list shows ids, kinds and plans).
select id, kind, coalesce(parent, ''), org, coalesce(plan, ''), concurrency, priority, shadow, created_at, updated_at
from accounts
where parent = @parent and id > @after
order by id
limit @limit
