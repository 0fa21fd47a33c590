-- The refunds and settlements not applied yet, oldest first, with their grant's account and whether it is voided.
select a.id, a.kind, a.grant_id, g.org, g.account, g.unit, a.units, g.voided_at is not null
from credit_adjustments a join credit_grants g on g.id = a.grant_id
where a.applied_at is null and a.kind in ('refund', 'settle')
order by a.id
