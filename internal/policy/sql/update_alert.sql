-- Replaces the kind, unit, period and thresholds of alert rule @id, returning it in scanAlert's columns; no row if there is none.
update alert_rules set kind = @kind, unit = @unit, period = @period, thresholds = @thresholds, updated_at = now()
where id = @id
returning id, coalesce(account, ''), coalesce(plan, ''), kind, unit, period, thresholds, created_at, updated_at
