-- The staged admissions into usage_events, each event's first delivery; late when its
-- billing period is closed.
insert into usage_events (event_id, billing_period, event_time, charged_period,
  org, account, account_kind, path, api_key_id, idempotency_key,
  plan, tool, source, fail_open,
  requests, tokens, credits, cost_micros, kafka_partition, kafka_offset, shadow_refusal, late)
select event_id, billing_period, event_time, charged_period,
  org, account, account_kind, path, api_key_id, idempotency_key,
  plan, tool, source, fail_open,
  requests, tokens, credits, cost_micros, kafka_partition, kafka_offset, shadow_refusal,
  exists (select 1 from periods p where p.period = m.billing_period)
from meter_usage m
order by event_id, kafka_partition, kafka_offset
on conflict (event_id, billing_period) do nothing
