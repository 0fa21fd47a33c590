-- The grant account @account made with @idempotency_key, in scanGrant's columns.
select id, org, account, unit, amount, effective_at, expires_at, priority, source,
    coalesce(idempotency_key, ''), created_at, voided_at, voided_units
from credit_grants
where account = @account and idempotency_key = @idempotency_key
