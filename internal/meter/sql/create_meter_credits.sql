-- The connection's staging table of credit draws (insert_credits.sql), emptied by every commit.
create temp table if not exists meter_credits (
  event_id text, grant_id text, billing_period date, charged_period date, event_time timestamptz, org text,
  account text, unit text, units bigint, kafka_partition integer, kafka_offset bigint
) on commit delete rows
