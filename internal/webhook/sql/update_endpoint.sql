-- Replaces @id's URL, types and account filter, enabled or disabled as it was.
update webhook_endpoints set url = @url, event_types = @event_types, account = @account, updated_at = now()
where id = @id
returning id, url, event_types, coalesce(account, ''), enabled, coalesce(disabled_reason, ''),
  consecutive_failures, created_at, updated_at
