-- Replaces @id's URL, types and account filter, and enables it: a disabled endpoint's run of
-- failures starts again from 0.
update webhook_endpoints set url = @url, event_types = @event_types, account = @account, updated_at = now(),
  enabled = true, disabled_reason = null,
  consecutive_failures = case when not enabled then 0 else consecutive_failures end
where id = @id
returning id, url, event_types, coalesce(account, ''), enabled, coalesce(disabled_reason, ''),
  consecutive_failures, created_at, updated_at
