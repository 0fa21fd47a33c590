-- Every alert rule, oldest first, in scanAlert's columns.
select id, coalesce(account, ''), coalesce(plan, ''), kind, unit, period, thresholds, created_at, updated_at
from alert_rules
order by created_at, id
