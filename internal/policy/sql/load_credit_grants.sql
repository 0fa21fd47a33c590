-- Per account and unit that ever had a credit grant (spent, expired or voided ones too), the units of its grants neither voided nor expired.
select account, unit,
       coalesce(sum(amount) filter (where voided_at is null and (expires_at is null or expires_at > now())), 0)::bigint
from credit_grants
group by account, unit
order by account, unit
