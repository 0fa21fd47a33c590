-- The recorded events of @org's period @period, of @account and below (NULL: every one),
-- at most @limit: the events an amendment by filter amends.
select event_id, billing_period, org
from usage_events
where org = @org and billing_period = @period and (@account::text is null or @account = any(path))
order by event_id
limit @limit
