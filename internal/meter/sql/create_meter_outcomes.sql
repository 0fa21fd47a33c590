-- The connection's staging table of outcomes (insert_outcomes.sql), emptied by every commit.
create temp table if not exists meter_outcomes (
  event_id text, status integer, requests bigint, tokens bigint, credits bigint, cost_micros bigint,
  outcome_time timestamptz, source text, kafka_partition integer, kafka_offset bigint
) on commit delete rows
