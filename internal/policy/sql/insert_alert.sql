-- Creates alert rule @id of account @account or plan @plan, returning it in scanAlert's columns.
insert into alert_rules (id, account, plan, kind, unit, period, thresholds)
values (@id, @account, @plan, @kind, @unit, @period, @thresholds)
returning id, coalesce(account, ''), coalesce(plan, ''), kind, unit, period, thresholds, created_at, updated_at
