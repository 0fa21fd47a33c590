-- The alert rules of plan @plan, oldest first, in scanAlert's columns.
select id, coalesce(account, ''), coalesce(plan, ''), kind, unit, period, thresholds, created_at, updated_at
from alert_rules
where plan = @plan
order by created_at, id
