-- Records the restore of grant @grant_id in Redis (@redis_before null when Redis had lost it), applied now.
insert into credit_adjustments (kind, grant_id, units, redis_before, redis_after, reason, applied_at)
values ('restore', @grant_id, @units, @redis_before, @redis_after, @reason, now())
