-- Ends endpoint @id's run of failed attempts (written only if it has one).
update webhook_endpoints set consecutive_failures = 0
where id = @id and consecutive_failures <> 0
