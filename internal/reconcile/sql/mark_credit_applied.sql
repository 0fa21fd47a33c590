-- Marks credit adjustment @id applied with the grant's Redis values before and after it; a row marked already is left as it is.
update credit_adjustments set applied_at = now(), redis_before = @redis_before, redis_after = @redis_after
where id = @id and applied_at is null
