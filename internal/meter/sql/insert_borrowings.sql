-- The staged borrowings into usage_borrowings, each one's first delivery.
insert into usage_borrowings (event_id, billing_period, charged_period, event_time, org,
  account, lender, unit, units)
select event_id, billing_period, charged_period, event_time, org,
  account, lender, unit, units
from meter_borrowings
order by event_id, account, unit, kafka_partition, kafka_offset
on conflict (event_id, account, unit) do nothing
