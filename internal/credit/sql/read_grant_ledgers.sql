-- Every grant of account @account with its books (the view finance_credit_grants).
select g.id, g.org, g.account, g.unit, g.amount, g.effective_at, g.expires_at, g.priority, g.source,
    coalesce(g.idempotency_key, ''), g.created_at, g.voided_at, g.voided_units,
    f.consumed, f.refunded, f.voided, f.expired, f.remaining
from credit_grants g join finance_credit_grants f on f.grant_id = g.id
where g.account = @account
