-- The recorded events whose ids are in @ids: their billing period and org.
select event_id, billing_period, org
from usage_events
where event_id = any(@ids)
