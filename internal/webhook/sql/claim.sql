-- Claim up to @limit due deliveries of enabled endpoints that no live lease holds, and lease
-- them until now() + @lease_s: no other deliverer takes them until the lease lapses. Returns
-- what an attempt needs: the alert's payload as stored, the endpoint's URL and every secret
-- that signs now (current first), and the database's now (the retry window's clock).
WITH due AS (
    SELECT d.id
    FROM webhook_deliveries d
    JOIN webhook_endpoints e ON e.id = d.endpoint
    WHERE d.status = 'pending'
      AND d.next_attempt_at <= now()
      AND (d.lease_until IS NULL OR d.lease_until <= now())
      AND e.enabled
    ORDER BY d.next_attempt_at
    LIMIT @limit
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries d
SET lease_until = now() + make_interval(secs => @lease_s),
    first_attempt_at = coalesce(d.first_attempt_at, now()),
    updated_at = now()
FROM due, webhook_endpoints e, usage_alerts a
WHERE d.id = due.id AND e.id = d.endpoint AND a.id = d.alert
RETURNING d.id, d.endpoint, d.alert, d.attempts, d.lease_until, d.first_attempt_at, now(), e.url,
    a.payload::text,
    ARRAY(SELECT s.secret FROM webhook_secrets s
          WHERE s.endpoint = e.id AND (s.expires_at IS NULL OR s.expires_at > now())
          ORDER BY s.expires_at IS NOT NULL, s.id DESC)
