-- Every grant not voided, with its remaining units by the ledger (finance_credit_grants:
-- amount - consumed + refunded, 0 once expired) and its terms, for the restore after a
-- Redis loss.
select g.id, g.org, g.account, g.unit, f.remaining, g.priority, g.effective_at, g.expires_at
from credit_grants g
join finance_credit_grants f on f.grant_id = g.id
where g.voided_at is null
order by g.id
