select id, url, event_types, coalesce(account, ''), enabled, coalesce(disabled_reason, ''),
  consecutive_failures, created_at, updated_at
from webhook_endpoints
where id = @id
