-- Records grant @id of account @account (its org the account's); no row back if the account does not exist or @idempotency_key made a grant before.
insert into credit_grants (id, org, account, unit, amount, effective_at, expires_at, priority, source, idempotency_key)
select @id, org, id, @unit, @amount, @effective_at, @expires_at, @priority, @source, @idempotency_key
from accounts
where id = @account
on conflict on constraint credit_grants_idempotency do nothing
returning id, org, account, unit, amount, effective_at, expires_at, priority, source,
    coalesce(idempotency_key, ''), created_at, voided_at, voided_units
