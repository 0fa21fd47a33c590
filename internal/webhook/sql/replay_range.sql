-- Queue, due now, a delivery to @endpoint of every alert with an event time in [@from, @to)
-- that the endpoint's types and account filter match (webhook_queue_alert's rule): an
-- existing delivery is queued again, a missing one is created.
INSERT INTO webhook_deliveries (endpoint, alert)
SELECT e.id, a.id
FROM webhook_endpoints e
JOIN usage_alerts a ON a.event_time >= @from AND a.event_time < @to
WHERE e.id = @endpoint
  AND 'usage.threshold.v1' = ANY (e.event_types)
  AND (e.account IS NULL OR e.account = ANY (a.path))
ON CONFLICT ON CONSTRAINT webhook_deliveries_once DO UPDATE
SET status = 'pending', next_attempt_at = now(), lease_until = NULL, first_attempt_at = NULL,
    delivered_at = NULL, updated_at = now()
