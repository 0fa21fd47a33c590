-- Claim up to @limit due deliveries of enabled endpoints that no live lease holds, and lease
-- them until now() + @lease_s: no other deliverer takes them until the lease lapses. Returns
-- what an attempt needs: the alert's payload as stored, the endpoint's URL and every secret
-- that signs now (current first), and the database's now (the retry window's clock).
with due as (
    select d.id
    from webhook_deliveries d
    join webhook_endpoints e on e.id = d.endpoint
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
from due, webhook_endpoints e, usage_alerts a
where d.id = due.id and e.id = d.endpoint and a.id = d.alert
returning d.id, d.endpoint, d.alert, d.attempts, d.lease_until, d.first_attempt_at, now(), e.url,
    a.payload::text,
    array(select s.secret from webhook_secrets s
          where s.endpoint = e.id and (s.expires_at is null or s.expires_at > now())
          order by s.expires_at is not null, s.id desc)
