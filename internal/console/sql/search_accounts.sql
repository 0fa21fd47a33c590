-- Accounts matching @q, at most @limit of each kind of match: an id starting with @q
-- (@prefix is @q with LIKE's wildcards escaped, and '%'), the account of the API key @q,
-- and the orgs whose legal name contains @q (@contains is '%' @q '%', escaped); each with
-- its org's legal name.
with found as (
    (select id, 'id' as matched from accounts where id like @prefix order by id limit @limit)
    union all
    (select account, 'api key' from api_keys where id = @q)
    union all
    (select org, 'name' from billing_details where legal_name ilike @contains order by legal_name limit @limit)
)
select a.id, a.kind, a.org, coalesce(a.plan, ''), coalesce(b.legal_name, ''), f.matched
from found f
join accounts a on a.id = f.id
left join billing_details b on b.org = a.org
