-- The connection's staging table of borrowings (insert_borrowings.sql), emptied by every commit.
create temp table if not exists meter_borrowings (
  event_id text, billing_period date, charged_period date, event_time timestamptz, org text,
  account text, lender text, unit text, units bigint, kafka_partition integer, kafka_offset bigint
) on commit delete rows
