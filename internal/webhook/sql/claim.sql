-- Claim up to @limit due deliveries of enabled endpoints that no live lease holds, and lease
-- them until now() + @lease_s: no other deliverer takes them until the lease lapses. Returns
-- what an attempt needs: the event's id (the webhook-id) and payload as stored, the alert's
-- or the billing event's; the endpoint's URL and every secret that signs now (current
-- first); and the database's now (the retry window's clock).
with due as (
    select d.id, coalesce(a.payload, b.payload) as payload
    from webhook_deliveries d
    join webhook_endpoints e on e.id = d.endpoint
    left join usage_alerts a on a.id = d.alert
    left join billing_events b on b.id = d.billing_event
    where d.status = 'pending'
      and d.next_attempt_at <= now()
      and (d.lease_until is null or d.lease_until <= now())
      and e.enabled
    order by d.next_attempt_at
    limit @limit
    for update of d skip locked
)
update webhook_deliveries d
set lease_until = now() + make_interval(secs => @lease_s),
    first_attempt_at = coalesce(d.first_attempt_at, now()),
    updated_at = now()
from due, webhook_endpoints e
where d.id = due.id and e.id = d.endpoint
returning d.id, d.endpoint, d.event, d.attempts, d.lease_until, d.first_attempt_at, now(), e.url,
    due.payload::text,
    array(select s.secret from webhook_secrets s
          where s.endpoint = e.id and (s.expires_at is null or s.expires_at > now())
          order by s.expires_at is not null, s.id desc)
