-- The connection's staging table of admissions (insert_usage.sql), emptied by every commit.
create temp table if not exists meter_usage (
  event_id text, billing_period date, event_time timestamptz, charged_period date,
  org text, account text, account_kind text, path text[], api_key_id text, idempotency_key text,
  plan text, tool text, source text, fail_open boolean,
  requests bigint, tokens bigint, credits bigint, cost_micros bigint,
  kafka_partition integer, kafka_offset bigint, shadow_refusal text
) on commit delete rows
