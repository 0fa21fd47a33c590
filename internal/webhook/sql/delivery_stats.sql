-- The gauges: deliveries pending, the age in seconds of the oldest due to an enabled
-- endpoint (0: none), endpoints disabled.
select
  (select count(*) from webhook_deliveries where status = 'pending'),
  (select coalesce(extract(epoch from now() - min(next_attempt_at)), 0)::float8 from webhook_deliveries d
     join webhook_endpoints e on e.id = d.endpoint where d.status = 'pending' and d.next_attempt_at <= now() and e.enabled),
  (select count(*) from webhook_endpoints where not enabled)
