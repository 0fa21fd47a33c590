-- The ids of @org's credit notes (NULL: every org's), after the id @after, oldest first, at
-- most @limit: a page of the credit notes API.
select id
from credit_notes
where (@org::text is null or org = @org)
  and id > @after
order by id
limit @limit
