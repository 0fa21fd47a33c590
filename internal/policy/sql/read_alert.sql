-- Alert rule @id in scanAlert's columns; no row if there is none.
select id, coalesce(account, ''), coalesce(plan, ''), kind, unit, period, thresholds, created_at, updated_at
from alert_rules
where id = @id
