-- The corrections of run @run_id marked applied whose recorded Redis values do not differ
-- by their amount, each as an invariant failure. The difference is numeric: values recorded
-- from a bad counter may be far apart, and must not make the check fail for every row.
select format('adjustment %s (%s %s %s): redis %s -> %s is not %s', id, kind, account, unit, redis_before, redis_after, amount)
from adjustments
where run_id = @run_id and applied_at is not null and redis_after::numeric - redis_before <> amount
order by id
