-- Replaces the plan, concurrency, priority and shadow flag of account @id (its overrides: insert_account_limit.sql).
update accounts set plan = @plan, concurrency = @concurrency, priority = @priority, shadow = @shadow, updated_at = now()
where id = @id
returning updated_at
