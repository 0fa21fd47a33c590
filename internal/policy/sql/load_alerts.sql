-- Every alert rule, for the cache, in scanAlert's columns; ordered so each owner's rules come out in one order every load.
select id, coalesce(account, ''), coalesce(plan, ''), kind, unit, period, thresholds, created_at, updated_at
from alert_rules
order by kind, unit, period
