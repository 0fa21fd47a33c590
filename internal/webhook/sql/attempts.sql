-- The log of delivery @delivery, oldest attempt first.
select started_at, latency_us, http_status, coalesce(error, ''), outcome
from webhook_attempts
where delivery = @delivery
order by id
