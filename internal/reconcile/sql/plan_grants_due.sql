-- Every account's recurring grants, from the plan it names (plan_grants), by account and unit.
select a.id, g.plan, g.unit, g.amount, g.priority
from plan_grants g join accounts a on a.plan = g.plan
order by a.id, g.unit
