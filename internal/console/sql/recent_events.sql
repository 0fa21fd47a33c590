-- The latest admissions (at most @limit) of account @account and the accounts below it
-- since @since, from the billing log, with their outcome and whether they were voided.
select e.event_id, e.event_time, e.account, coalesce(e.api_key_id, ''), coalesce(e.idempotency_key, ''),
       e.requests, e.tokens, e.credits, e.cost_micros, coalesce(e.shadow_refusal, ''),
       o.event_id is not null, v.event_id is not null
from usage_events e
left join usage_outcomes o on o.event_id = e.event_id
left join usage_voids v on v.event_id = e.event_id
where e.path @> array[@account::text]
  and e.billing_period >= date_trunc('month', @since::timestamptz at time zone 'UTC')::date
  and e.event_time >= @since
order by e.event_time desc
limit @limit
