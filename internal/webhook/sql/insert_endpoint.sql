insert into webhook_endpoints (id, url, event_types, account, enabled, disabled_reason)
values (@id, @url, @event_types, @account, @enabled, @disabled_reason)
returning id, url, event_types, coalesce(account, ''), enabled, coalesce(disabled_reason, ''),
  consecutive_failures, created_at, updated_at
