-- Queue, due now, a delivery to @endpoint of every alert with an event time in [@from, @to)
-- that the endpoint's types and account filter match (webhook_queue_alert's rule): an
-- existing delivery is queued again, a missing one is created.
insert into webhook_deliveries (endpoint, alert)
select e.id, a.id
from webhook_endpoints e
join usage_alerts a on a.event_time >= @from and a.event_time < @to
where e.id = @endpoint
  and 'usage.threshold.v1' = any (e.event_types)
  and (e.account is null or e.account = any (a.path))
on conflict on constraint webhook_deliveries_once do update
set status = 'pending', next_attempt_at = now(), lease_until = null, first_attempt_at = null,
    delivered_at = null, updated_at = now()
