-- The staged outcomes into usage_outcomes, each request's first.
insert into usage_outcomes (event_id, status, requests, tokens, credits, cost_micros,
  outcome_time, source, kafka_partition, kafka_offset)
select event_id, status, requests, tokens, credits, cost_micros,
  outcome_time, source, kafka_partition, kafka_offset
from meter_outcomes
order by event_id, kafka_partition, kafka_offset
on conflict (event_id) do nothing
