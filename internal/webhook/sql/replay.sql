-- Queues delivery @id of @endpoint again, due now, whatever its status; a lease held by a
-- deliverer is dropped.
update webhook_deliveries set status = 'pending', next_attempt_at = now(), lease_until = null,
  first_attempt_at = null, delivered_at = null, updated_at = now()
where id = @id and endpoint = @endpoint
returning id, endpoint, event, status, attempts,
  case when status = 'pending' then next_attempt_at end, first_attempt_at, delivered_at,
  last_status, coalesce(last_error, ''), created_at
