-- Adds a failed attempt to endpoint @id's run and returns the run and whether it is enabled.
update webhook_endpoints set consecutive_failures = consecutive_failures + 1
where id = @id
returning consecutive_failures, enabled
