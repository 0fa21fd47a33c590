-- The admission @event_id of the billing log, with its outcome and void if any.
select e.event_id, e.event_time, e.ingest_time, e.billing_period, e.charged_period, e.org, e.account,
       e.account_kind, e.path, coalesce(e.api_key_id, ''), coalesce(e.idempotency_key, ''), coalesce(e.plan, ''),
       coalesce(e.tool, ''), e.source, e.fail_open, e.late, coalesce(e.shadow_refusal, ''),
       e.requests, e.tokens, e.credits, e.cost_micros, e.kafka_partition, e.kafka_offset,
       o.status, o.requests, o.tokens, o.credits, o.cost_micros, o.outcome_time,
       v.reason, v.void_time
from usage_events e
left join usage_outcomes o on o.event_id = e.event_id
left join usage_voids v on v.event_id = e.event_id
where e.event_id = @event_id
