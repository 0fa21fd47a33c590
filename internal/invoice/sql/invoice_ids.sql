-- The ids of the invoices matching the filters (a NULL filter matches every invoice), after
-- the id @after, oldest first, at most @limit: a page of the invoices API.
select id
from invoices
where (@org::text is null or org = @org)
  and (@period::date is null or period = @period)
  and (@status::text is null or status = @status)
  and id > @after
order by id
limit @limit
