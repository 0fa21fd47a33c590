-- The first admission of idempotency key @key of account @account at or after @since that
-- was not voided (usage_voids: no caller was told 200 for it, and invoices skip it, as
-- finance_billable_events does). The billing_period bounds let PostgreSQL skip every other
-- partition (the current and the previous month, for a day's TTL); the partial index
-- usage_events_idempotency_idx (migration 00021) finds the key's rows in each.
select e.event_id, e.charged_period, e.requests, e.tokens, e.credits, e.cost_micros, coalesce(e.tool, '')
from usage_events e
where e.account = @account
  and e.idempotency_key = @key
  and e.idempotency_key is not null
  and e.event_time >= @since
  and e.billing_period >= @first_period
  and e.billing_period <= @last_period
  and not exists (select 1 from usage_voids v where v.event_id = e.event_id)
order by e.event_time, e.event_id
limit 1
