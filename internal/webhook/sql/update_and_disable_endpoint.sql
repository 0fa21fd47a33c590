-- Replaces @id's URL, types and account filter, and disables it for @reason unless it is
-- disabled already (for its own reason, kept).
update webhook_endpoints set url = @url, event_types = @event_types, account = @account, updated_at = now(),
  enabled = false, disabled_reason = coalesce(disabled_reason, @reason)
where id = @id
returning id, url, event_types, coalesce(account, ''), enabled, coalesce(disabled_reason, ''),
  consecutive_failures, created_at, updated_at
