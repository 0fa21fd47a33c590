update webhook_endpoints set enabled = false, disabled_reason = @reason, updated_at = now()
where id = @id
