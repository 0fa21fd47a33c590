-- Marks correction @id applied with the counter's values before and after it; a row marked
-- already (by a run that died after marking it) is left as it is.
update adjustments set redis_before = @redis_before, redis_after = @redis_after, applied_at = now()
where id = @id and applied_at is null
