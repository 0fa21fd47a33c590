-- The children of account @parent after @after by id, at most @limit.
select id, kind, org, coalesce(plan, ''), '', ''
from accounts
where parent = @parent and id > @after
order by id
limit @limit
