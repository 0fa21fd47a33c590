-- Queue, due now, a delivery to @endpoint of every event of [@from, @to) (an alert's
-- event_time, a billing event's occurred_at) that the endpoint takes (webhook_takes, the
-- triggers' rule): an existing delivery is queued again, a missing one is created.
insert into webhook_deliveries (endpoint, alert, billing_event)
select e.id, a.id, null
from webhook_endpoints e
join usage_alerts a on a.event_time >= @from and a.event_time < @to
where e.id = @endpoint and webhook_takes(e, 'usage.threshold.v1', a.path)
union all
select e.id, null, b.id
from webhook_endpoints e
join billing_events b on b.occurred_at >= @from and b.occurred_at < @to
where e.id = @endpoint and webhook_takes(e, b.type, array[b.org])
on conflict on constraint webhook_deliveries_once do update
set status = 'pending', next_attempt_at = now(), lease_until = null, first_attempt_at = null,
    delivered_at = null, updated_at = now()
