-- Grant @id of account @account, in scanGrant's columns.
select id, org, account, unit, amount, effective_at, expires_at, priority, source,
    coalesce(idempotency_key, ''), created_at, voided_at, voided_units
from credit_grants
where id = @id and account = @account
