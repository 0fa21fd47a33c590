-- @endpoint's latest deliveries, newest first, at most @limit.
select id, endpoint, event, status, attempts,
  case when status = 'pending' then next_attempt_at end, first_attempt_at, delivered_at,
  last_status, coalesce(last_error, ''), created_at
from webhook_deliveries
where endpoint = @endpoint
order by id desc
limit @limit
