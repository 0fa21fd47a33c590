-- The smallest plan (lowest rank) and whether it has a price: unknown plans are billed on it.
select p.id, exists (select 1 from plan_prices pp where pp.plan = p.id)
from plans p
order by p.rank
limit 1
