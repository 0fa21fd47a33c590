-- The staged credit draws into credit_consumptions, each one's first delivery.
insert into credit_consumptions (event_id, grant_id, billing_period, charged_period, event_time, org,
  account, unit, units)
select event_id, grant_id, billing_period, charged_period, event_time, org,
  account, unit, units
from meter_credits
order by event_id, grant_id, kafka_partition, kafka_offset
on conflict (event_id, grant_id) do nothing
