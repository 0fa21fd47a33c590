-- Marks @id updated (its secrets change) and returns it; locks it until the transaction ends.
update webhook_endpoints set updated_at = now()
where id = @id
returning id, url, event_types, coalesce(account, ''), enabled, coalesce(disabled_reason, ''),
  consecutive_failures, created_at, updated_at
