-- Whether @org is an org, and the currency its plan's price version of @period is in (NULL
-- when it has no plan or the plan no price).
select a.kind = 'org', pp.currency
from accounts a
left join plan_prices pp on pp.plan = a.plan and pp.version = price_version(a.plan, @period)
where a.id = @org
