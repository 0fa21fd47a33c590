-- Every endpoint, oldest first.
select id, url, event_types, coalesce(account, ''), enabled, coalesce(disabled_reason, ''),
  consecutive_failures, created_at, updated_at
from webhook_endpoints
order by created_at, id
