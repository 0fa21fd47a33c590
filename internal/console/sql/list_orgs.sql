-- Orgs after @after by id, at most @limit, with their legal names.
select a.id, a.kind, a.org, coalesce(a.plan, ''), coalesce(b.legal_name, ''), ''
from accounts a
left join billing_details b on b.org = a.id
where a.kind = 'org' and a.id > @after
order by a.id
limit @limit
