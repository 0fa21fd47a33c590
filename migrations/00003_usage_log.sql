-- +goose Up
-- The billing log: one row per admitted request (usage_events) and one per reported outcome
-- (usage_outcomes), written by the meter from Kafka (internal/meter). Rows are inserted with
-- ON CONFLICT DO NOTHING, so a message delivered again (after a crash or a rebalance) is
-- kept once. The log is a sliding log: usage_of below gives any account's exact usage over
-- any window.

-- Partitioned by billing month. The unique key must hold the partition key, and a duplicate
-- of an event always carries the same event time (it is the same CloudEvent, delivered
-- again), so it lands in the same partition: (event_id, billing_period) is in effect unique
-- on event_id for ever. There is no DEFAULT partition: it would have to be scanned, and
-- would block, when a month's partition is added later. The meter adds partitions ahead of
-- time and on demand (usage_events_partition).
CREATE TABLE usage_events (
    event_id        text        NOT NULL,
    billing_period  date        NOT NULL,
    event_time      timestamptz NOT NULL,
    ingest_time     timestamptz NOT NULL DEFAULT now(),
    charged_period  date        NOT NULL,
    org             text        NOT NULL,
    account         text        NOT NULL,
    account_kind    text        NOT NULL,
    path            text[]      NOT NULL,
    api_key_id      text,
    idempotency_key text,
    plan            text,
    tool            text,
    source          text        NOT NULL,
    fail_open       boolean     NOT NULL DEFAULT false,
    requests        bigint      NOT NULL DEFAULT 0 CHECK (requests >= 0),
    tokens          bigint      NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    credits         bigint      NOT NULL DEFAULT 0 CHECK (credits >= 0),
    cost_micros     bigint      NOT NULL DEFAULT 0 CHECK (cost_micros >= 0),
    late            boolean     NOT NULL DEFAULT false,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    PRIMARY KEY (event_id, billing_period),
    CONSTRAINT usage_events_billing_period CHECK (billing_period = date_trunc('month', event_time AT TIME ZONE 'UTC')::date),
    CONSTRAINT usage_events_charged_period CHECK (extract(day FROM charged_period) = 1),
    CONSTRAINT usage_events_path CHECK (cardinality(path) >= 1 AND path[1] = org AND path[cardinality(path)] = account)
) PARTITION BY RANGE (billing_period);

-- "Usage of this node and everything under it": path @> ARRAY[account].
CREATE INDEX usage_events_path_idx ON usage_events USING gin (path);
-- Rows arrive in roughly event-time order: a BRIN index is nearly free to maintain and
-- narrows time windows inside a month.
CREATE INDEX usage_events_event_time_idx ON usage_events USING brin (event_time);

COMMENT ON TABLE usage_events IS 'The billing log: one row per admitted request (CloudEvent io.metergate.usage.admitted.v1), written once by the meter, partitioned by billing_period.';
COMMENT ON COLUMN usage_events.event_id IS 'CloudEvents id of the admission (<UUIDv7>.<shard>.<org>); unique for ever (see the primary key).';
COMMENT ON COLUMN usage_events.billing_period IS 'First day of the UTC month of event_time: the month this request is billed in, and the partition key.';
COMMENT ON COLUMN usage_events.event_time IS 'When the request was admitted: the CloudEvents time (Redis TIME; the admit node''s clock for fail_open events).';
COMMENT ON COLUMN usage_events.ingest_time IS 'When the meter wrote the row.';
COMMENT ON COLUMN usage_events.charged_period IS 'First day of the month whose quota counters admit charged (data.period). It differs from billing_period only for a request at a month boundary; reconcile moves such usage (period_move).';
COMMENT ON COLUMN usage_events.account IS 'The account the request was admitted for: the last element of path.';
COMMENT ON COLUMN usage_events.account_kind IS 'Kind of that account: org, team, user or agent.';
COMMENT ON COLUMN usage_events.path IS 'Every level the request was charged to, org first, the account last.';
COMMENT ON COLUMN usage_events.plan IS 'The org''s plan at admission time.';
COMMENT ON COLUMN usage_events.tool IS 'Tool named by the request (its credits are in credits).';
COMMENT ON COLUMN usage_events.source IS 'CloudEvents source: the admit node.';
COMMENT ON COLUMN usage_events.fail_open IS 'Admitted without Redis (rate-only account while Redis was unavailable): no limit was enforced and the period came from the admit node''s clock.';
COMMENT ON COLUMN usage_events.requests IS 'Units charged, as admitted (tokens are estimates; actual tokens are in usage_outcomes).';
COMMENT ON COLUMN usage_events.cost_micros IS 'Money, in millionths of the currency unit.';
COMMENT ON COLUMN usage_events.late IS 'Arrived after its billing period was closed; billed on a later invoice as an adjustment.';
COMMENT ON COLUMN usage_events.kafka_partition IS 'Kafka partition and offset of the message the row was written from (the first delivery).';

-- One outcome per admitted request: its id is the admission's event id, and the first
-- outcome written wins. No foreign key: an outcome may be metered before its admission when
-- they are in different batches of different meters, and an admission may be dead-lettered.
CREATE TABLE usage_outcomes (
    event_id        text        PRIMARY KEY,
    status          integer     NOT NULL CHECK (status BETWEEN 100 AND 599),
    requests        bigint      CHECK (requests >= 0),
    tokens          bigint      CHECK (tokens >= 0),
    credits         bigint      CHECK (credits >= 0),
    cost_micros     bigint      CHECK (cost_micros >= 0),
    outcome_time    timestamptz NOT NULL,
    ingest_time     timestamptz NOT NULL DEFAULT now(),
    source          text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL
);

COMMENT ON TABLE usage_outcomes IS 'How admitted requests ended upstream (CloudEvent io.metergate.usage.outcome.v1); the first outcome of a request wins.';
COMMENT ON COLUMN usage_outcomes.event_id IS 'The admission''s event id (usage_events.event_id); the CloudEvents id is <event_id>/outcome.';
COMMENT ON COLUMN usage_outcomes.status IS 'Upstream HTTP status: reconcile refunds the quota of a 5xx.';
COMMENT ON COLUMN usage_outcomes.tokens IS 'Actual units, when reported (NULL: not reported); reconcile settles estimated against actual tokens.';
COMMENT ON COLUMN usage_outcomes.outcome_time IS 'CloudEvents time of the outcome.';

-- Adds the partition of usage_events for the month of the given date unless it exists,
-- and returns its name (usage_events_YYYY_MM). The table is created alone and then attached:
-- ATTACH PARTITION takes a SHARE UPDATE EXCLUSIVE lock on usage_events, which lets inserts
-- and reads go on, where CREATE TABLE ... PARTITION OF would take an ACCESS EXCLUSIVE lock
-- and queue every insert behind any long finance query. Concurrent callers are serialized by
-- a transaction-scoped advisory lock; lock_timeout bounds the wait for the parent's lock
-- (the meter retries).
-- +goose StatementBegin
CREATE FUNCTION usage_events_partition(month date) RETURNS text
LANGUAGE plpgsql SET lock_timeout = '5s' AS $$
DECLARE
    parent regclass := 'usage_events'::regclass;
    first  date := date_trunc('month', month::timestamp)::date;
    name   text := 'usage_events_' || to_char(first, 'YYYY_MM');
    nsp    text;
BEGIN
    -- The partition goes into the schema of usage_events, whatever the search_path.
    SELECT n.nspname INTO nsp FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = parent;
    FOR attempt IN 1..2 LOOP
        IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                   WHERE i.inhparent = parent AND c.relname = name AND c.relnamespace = nsp::regnamespace) THEN
            RETURN name;
        END IF;
        EXIT WHEN attempt = 2;
        PERFORM pg_advisory_xact_lock(hashtext('metergate.usage_events_partition'), hashtext(nsp || '.' || name));
    END LOOP;
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', nsp, name, parent);
    EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
        parent, nsp, name, first, (first + interval '1 month')::date);
    RETURN name;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION usage_events_partition(date) IS 'Adds the usage_events partition of the month of the given date unless it exists; returns its name.';

-- The exact usage of an account, at any level of the tree (the account itself and every
-- node under it: account = ANY(path), written as path @> ARRAY[account] so the GIN index
-- serves it), over [from_time, to_time) by event time. One row, zeros when nothing matched.
-- The billing_period bounds only let PostgreSQL skip the partitions outside the window.
--   SELECT * FROM usage_of('acme', '2026-11-01T00:00:00Z', '2026-12-01T00:00:00Z');
CREATE FUNCTION usage_of(account text, from_time timestamptz, to_time timestamptz)
RETURNS TABLE (events bigint, requests numeric, tokens numeric, credits numeric, cost_micros numeric)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT count(*),
           coalesce(sum(e.requests), 0),
           coalesce(sum(e.tokens), 0),
           coalesce(sum(e.credits), 0),
           coalesce(sum(e.cost_micros), 0)
    FROM usage_events e
    WHERE e.path @> ARRAY[usage_of.account]
      AND e.event_time >= usage_of.from_time
      AND e.event_time < usage_of.to_time
      AND e.billing_period >= date_trunc('month', usage_of.from_time AT TIME ZONE 'UTC')::date
      AND e.billing_period <= (usage_of.to_time AT TIME ZONE 'UTC')::date
$$;

COMMENT ON FUNCTION usage_of(text, timestamptz, timestamptz) IS 'Exact usage (events, requests, tokens, credits, cost_micros) of an account and everything under it over [from_time, to_time) by event time.';

-- +goose Down
DROP FUNCTION usage_of(text, timestamptz, timestamptz);
DROP FUNCTION usage_events_partition(date);
DROP TABLE usage_outcomes;
DROP TABLE usage_events;
