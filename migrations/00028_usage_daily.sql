-- +goose Up
-- Usage per account and UTC day (issue 33): what the customer portal and the console's
-- account chart read, where summing the billing log's rows would read millions of them for
-- a year of one org. It is exact at every commit: for every account A and UTC day D the
-- view usage_daily holds what billable_events sums over its events e with
-- e.path @> ARRAY[A] and (e.event_time AT TIME ZONE 'UTC')::date = D: count(*) as events,
-- and billable_requests, billable_tokens, billable_credits and billable_cost_micros.
--
-- Triggers keep it: each INSERT, UPDATE or DELETE of usage_events, usage_outcomes or
-- usage_voids adds, to every account on the path of each event it changes and the event's
-- day, what the event bills after less what it billed before (bills_nothing and
-- billable_units of 00009: the rule is the view's). Four choices:
--
-- 1. Inserts, all the meter writes, are counted when their transaction commits: each
--    statement queues what it inserted (usage_daily_queue, one row), and a deferred
--    constraint trigger flushes the transaction's queue at COMMIT (usage_daily_flush).
-- 2. An outcome or a void may be written before its admission, or at the same time by
--    another transaction: whichever commits second must see the first. So the flush
--    first locks the transaction's events, all at once in one order (advisory transaction
--    locks keyed by event id: shared for admissions, exclusive for outcomes and voids),
--    then reads the other tables in a statement of its own, whose snapshot (READ
--    COMMITTED) holds what the transaction it waited for committed. Taken at COMMIT, the
--    locks are held for the commit alone: the meter's writers wait on one another only
--    when two commit at once, where locks taken by each statement would make an outcome
--    wait for the whole transaction writing its admission. Past usage_daily_lock_limit()
--    events, a transaction takes the schema's writers' lock exclusively instead
--    (PostgreSQL's lock table is bounded): a bulk load waits for every other writer and
--    they for it. UPDATE and DELETE, which the services never run, are counted at once,
--    after the transaction's queue is flushed.
-- 3. Changes are appended to usage_daily_changes, and one transaction at a time (the one
--    that finds the fold lock free) folds them into usage_daily_totals; the view adds the
--    two. Upserting the totals from every transaction would make the meter's writers wait
--    on one another's (org, day) rows until each commits.
-- 4. TRUNCATE rebuilds the rollup from the log (usage_daily_rebuild). Rows that reach the
--    log without a trigger (a partition attached with rows in it, or written directly
--    rather than through usage_events) are not in it until usage_daily_rebuild() runs.

-- Accounts sort bytewise ("C"): the fold sorts and looks up hundreds of them per batch of
-- the meter, and a locale's comparisons cost several times as much. Units are numeric, as
-- usage_of's sums: a day's sum past bigint (2^63 - 1) is stored, not an error that would
-- stop the meter writing the rows it sums (finance.md, "One org's failed invoice").
CREATE TABLE usage_daily_totals (
    account     text    COLLATE "C" NOT NULL,
    day         date    NOT NULL,
    events      bigint  NOT NULL,
    requests    numeric NOT NULL,
    tokens      numeric NOT NULL,
    credits     numeric NOT NULL,
    cost_micros numeric NOT NULL,
    PRIMARY KEY (account, day)
);

-- No key and no index: rows are only ever appended by the triggers, a few hundred per
-- statement of the meter, and removed all at once by the fold; a reader scans the few
-- thousand not folded yet.
CREATE TABLE usage_daily_changes (
    account     text    COLLATE "C" NOT NULL,
    day         date    NOT NULL,
    events      bigint  NOT NULL,
    requests    numeric NOT NULL,
    tokens      numeric NOT NULL,
    credits     numeric NOT NULL,
    cost_micros numeric NOT NULL
);

COMMENT ON TABLE usage_daily_totals IS 'Folded part of usage_daily: one row per account and UTC day, written only by the fold (usage_daily_add) and usage_daily_rebuild.';
COMMENT ON TABLE usage_daily_changes IS 'Part of usage_daily not folded into usage_daily_totals yet: signed changes appended by the triggers of usage_events, usage_outcomes and usage_voids.';

-- An admission as the queue keeps it: what its billing needs.
CREATE TYPE usage_daily_event AS (
    event_id    text,
    path        text[],
    day         date,
    requests    bigint,
    tokens      bigint,
    credits     bigint,
    cost_micros bigint
);

-- What a transaction inserted and has not counted yet: a row per statement, deleted by the
-- flush at COMMIT, so that no row is ever seen by another transaction (UNLOGGED: none
-- outlives its transaction).
CREATE UNLOGGED TABLE usage_daily_queue (
    kind   "char" NOT NULL CHECK (kind IN ('e', 'o', 'v')),
    events usage_daily_event[],
    ids    text[]
);

COMMENT ON TABLE usage_daily_queue IS 'Rows the current transaction inserted into usage_events (kind e: events), usage_outcomes (o) or usage_voids (v: ids) and has not counted into usage_daily yet; flushed at COMMIT.';

-- What a statement changed of one event's billing: the event's path and UTC day, and the
-- signed change of its count and of each unit it bills.
CREATE TYPE usage_daily_change AS (
    path        text[],
    day         date,
    events      bigint,
    requests    bigint,
    tokens      bigint,
    credits     bigint,
    cost_micros bigint
);

-- The view reads like a table: a row per account and day that has any usage.
CREATE VIEW usage_daily AS
SELECT account, day, sum(events)::bigint AS events, sum(requests) AS requests,
       sum(tokens) AS tokens, sum(credits) AS credits, sum(cost_micros) AS cost_micros
FROM (SELECT account, day, events, requests, tokens, credits, cost_micros FROM usage_daily_totals
      UNION ALL
      SELECT account, day, events, requests, tokens, credits, cost_micros FROM usage_daily_changes) u
GROUP BY account, day
HAVING (sum(events), sum(requests), sum(tokens), sum(credits), sum(cost_micros)) <> (0, 0, 0, 0, 0);

COMMENT ON VIEW usage_daily IS 'Usage of each account and everything under it per UTC day of event_time: count(*) and the billable units of billable_events, exact at every commit (migration 00028).';

-- How often a statement folds usage_daily_changes into usage_daily_totals (when no other
-- transaction is folding): the changes of a few statements are folded at once, each
-- (account, day) of theirs updated once.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_fold_odds() RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1.0 / 16 $$;
-- +goose StatementEnd

-- Most event locks a transaction takes before it locks the schema's writers instead.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_lock_limit() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 2000 $$;
-- +goose StatementEnd

-- Locks events until the transaction ends, all in one order (keys sorted): shared the
-- admissions (an event is inserted once), exclusive the events whose outcome or void is
-- written, after a shared lock of the schema's writers. A transaction past
-- usage_daily_lock_limit() locks takes the writers' lock exclusively instead, and keeps it;
-- the setting metergate.usage_daily_locks counts its locks (-1: exclusive).
-- +goose StatementBegin
CREATE FUNCTION usage_daily_lock(shared_ids text[], exclusive_ids text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    writers bigint := hashtextextended('metergate.usage_daily writers ' || current_schema(), 0);
    seed    bigint := hashtext('metergate.usage_daily events ' || current_schema());
    held    bigint := coalesce(nullif(current_setting('metergate.usage_daily_locks', true), ''), '0')::bigint;
    n       bigint := cardinality(shared_ids) + cardinality(exclusive_ids);
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF held < 0 OR held + n > usage_daily_lock_limit() THEN
        PERFORM pg_advisory_xact_lock(writers);
        PERFORM set_config('metergate.usage_daily_locks', '-1', true);
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(writers);
    PERFORM CASE WHEN x THEN pg_advisory_xact_lock(k) ELSE pg_advisory_xact_lock_shared(k) END
    FROM (SELECT k, bool_or(x) AS x
          FROM (SELECT hashtextextended(id, seed), false FROM unnest(shared_ids) id
                UNION ALL
                SELECT hashtextextended(id, seed), true FROM unnest(exclusive_ids) id) ids(k, x)
          GROUP BY k
          ORDER BY k) s;
    PERFORM set_config('metergate.usage_daily_locks', (held + n)::text, true);
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION usage_daily_lock(text[], text[]) IS 'Locks events (shared, exclusive) in one order until the transaction ends, for usage_daily; past usage_daily_lock_limit() locks, the schema''s writers'' lock exclusively instead.';

-- Adds changes to usage_daily, under every account of each change's path (once, whatever
-- the path repeats), summed per account and day (hashed: sorting the keys costs more). One
-- statement in usage_daily_fold_odds() folds, if it gets the fold lock (taken without
-- waiting, kept until its transaction ends): every visible change, its own with them, into
-- usage_daily_totals, which only the holder of that lock writes (no order needed against
-- deadlocks). The others append theirs to usage_daily_changes.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_add(changes usage_daily_change[]) RETURNS void
LANGUAGE plpgsql SET enable_sort = off AS $$
BEGIN
    IF cardinality(changes) = 0 THEN
        RETURN;
    END IF;
    IF random() < usage_daily_fold_odds()
       AND pg_try_advisory_xact_lock(hashtextextended('metergate.usage_daily fold ' || current_schema(), 0)) THEN
        WITH folded AS (
            DELETE FROM usage_daily_changes
            RETURNING account, day, events, requests, tokens, credits, cost_micros
        ), added AS (
            SELECT a.account COLLATE "C", c.day, c.events, c.requests, c.tokens, c.credits, c.cost_micros
            FROM unnest(changes) c
            CROSS JOIN LATERAL unnest(c.path) WITH ORDINALITY a(account, n)
            WHERE a.account IS NOT NULL AND a.account <> ALL (c.path[:a.n - 1])
        )
        INSERT INTO usage_daily_totals AS t (account, day, events, requests, tokens, credits, cost_micros)
        SELECT account, day, sum(events), sum(requests), sum(tokens), sum(credits), sum(cost_micros)
        FROM (SELECT * FROM folded UNION ALL SELECT * FROM added) u
        GROUP BY account, day
        HAVING (sum(events), sum(requests), sum(tokens), sum(credits), sum(cost_micros)) <> (0, 0, 0, 0, 0)
        ON CONFLICT (account, day) DO UPDATE
        SET events = t.events + excluded.events, requests = t.requests + excluded.requests,
            tokens = t.tokens + excluded.tokens, credits = t.credits + excluded.credits,
            cost_micros = t.cost_micros + excluded.cost_micros;
    ELSE
        INSERT INTO usage_daily_changes (account, day, events, requests, tokens, credits, cost_micros)
        SELECT a.account COLLATE "C", c.day, sum(c.events), sum(c.requests), sum(c.tokens), sum(c.credits), sum(c.cost_micros)
        FROM unnest(changes) c
        CROSS JOIN LATERAL unnest(c.path) WITH ORDINALITY a(account, n)
        WHERE a.account IS NOT NULL AND a.account <> ALL (c.path[:a.n - 1])
        GROUP BY 1, c.day
        HAVING (sum(c.events), sum(c.requests), sum(c.tokens), sum(c.credits), sum(c.cost_micros)) <> (0, 0, 0, 0, 0);
    END IF;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION usage_daily_add(usage_daily_change[]) IS 'Adds signed changes to usage_daily under every account of their paths; folds every visible change into usage_daily_totals when the fold lock is free.';

-- The admission of an outcome or void written at a given time: looked for in the months
-- around that time (its own and the two beside it), then, when it is not there, in every
-- other month. An event is one row (usage_events: the same CloudEvent, delivered again, has
-- the same time), so the first found is it. An outcome reads 3 partitions rather than a
-- year's 15: its admission's key looked up in each costs a btree descent.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_event(event_id text, near timestamptz)
RETURNS TABLE (path text[], event_time timestamptz, requests bigint, tokens bigint, credits bigint, cost_micros bigint)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT * FROM (
        SELECT e.path, e.event_time, e.requests, e.tokens, e.credits, e.cost_micros
        FROM usage_events e
        WHERE e.event_id = usage_daily_event.event_id
          AND e.billing_period BETWEEN (date_trunc('month', near AT TIME ZONE 'UTC') - interval '1 month')::date
                                   AND (date_trunc('month', near AT TIME ZONE 'UTC') + interval '1 month')::date
        UNION ALL
        SELECT e.path, e.event_time, e.requests, e.tokens, e.credits, e.cost_micros
        FROM usage_events e
        WHERE e.event_id = usage_daily_event.event_id
          AND NOT e.billing_period BETWEEN (date_trunc('month', near AT TIME ZONE 'UTC') - interval '1 month')::date
                                       AND (date_trunc('month', near AT TIME ZONE 'UTC') + interval '1 month')::date
    ) found
    LIMIT 1
$$;
-- +goose StatementEnd

-- Whether an outcome changes what its event bills: a 5xx, or actual units reported.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_bills(status integer, requests bigint, tokens bigint, credits bigint, cost_micros bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT bills_nothing(status, false) OR num_nonnulls(requests, tokens, credits, cost_micros) > 0 $$;
-- +goose StatementEnd

-- Counts what the transaction queued (usage_daily_queue) and empties the queue: its
-- admissions bill what their outcomes and voids say now; each event whose outcome or void it
-- wrote (and that it did not admit) bills what it bills now less what it billed before
-- those. Called at COMMIT and before an UPDATE or DELETE (usage_daily_on_flush). Lookups
-- go by key whatever the statistics say (enable_seqscan off; and jit off: the disabled
-- scans' cost would make every query compile).
-- +goose StatementBegin
CREATE FUNCTION usage_daily_flush() RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    admitted usage_daily_event[];
    outcomes text[];
    voids    text[];
BEGIN
    SELECT coalesce(array_agg(e), '{}') INTO admitted
    FROM usage_daily_queue q CROSS JOIN LATERAL unnest(q.events) e WHERE q.kind = 'e';
    SELECT coalesce(array_agg(DISTINCT i) FILTER (WHERE q.kind = 'o'), '{}'),
           coalesce(array_agg(DISTINCT i) FILTER (WHERE q.kind = 'v'), '{}')
    INTO outcomes, voids
    FROM usage_daily_queue q CROSS JOIN LATERAL unnest(q.ids) i;
    IF cardinality(admitted) + cardinality(outcomes) + cardinality(voids) = 0 THEN
        RETURN;
    END IF;
    DELETE FROM usage_daily_queue;
    PERFORM usage_daily_lock(ARRAY(SELECT event_id FROM unnest(admitted)), outcomes || voids);
    -- A statement of its own after the locks: its snapshot is taken after them.
    PERFORM usage_daily_add(ARRAY(
        SELECT ROW(e.path, e.day, 1,
                   billable_units(e.requests, o.requests, n.nothing), billable_units(e.tokens, o.tokens, n.nothing),
                   billable_units(e.credits, o.credits, n.nothing), billable_units(e.cost_micros, o.cost_micros, n.nothing)
               )::usage_daily_change
        FROM unnest(admitted) e
        LEFT JOIN (SELECT * FROM usage_outcomes WHERE event_id = ANY (ARRAY(SELECT event_id FROM unnest(admitted)))) o ON o.event_id = e.event_id
        LEFT JOIN (SELECT event_id FROM usage_voids WHERE event_id = ANY (ARRAY(SELECT event_id FROM unnest(admitted)))) v ON v.event_id = e.event_id
        CROSS JOIN LATERAL (SELECT bills_nothing(o.status, v.event_id IS NOT NULL)) n(nothing)
        UNION ALL
        SELECT ROW(e.path, (e.event_time AT TIME ZONE 'UTC')::date, 0,
                   billable_units(e.requests, o.requests, n.now) - billable_units(e.requests, b.requests, n.was),
                   billable_units(e.tokens, o.tokens, n.now) - billable_units(e.tokens, b.tokens, n.was),
                   billable_units(e.credits, o.credits, n.now) - billable_units(e.credits, b.credits, n.was),
                   billable_units(e.cost_micros, o.cost_micros, n.now) - billable_units(e.cost_micros, b.cost_micros, n.was)
               )::usage_daily_change
        FROM (SELECT x.id, bool_or(x.outcome) AS outcome, bool_or(NOT x.outcome) AS void
              FROM (SELECT id, true FROM unnest(outcomes) id UNION ALL SELECT id, false FROM unnest(voids) id) x(id, outcome)
              WHERE NOT EXISTS (SELECT 1 FROM unnest(admitted) a WHERE a.event_id = x.id)
              GROUP BY x.id) w
        LEFT JOIN LATERAL (SELECT * FROM usage_outcomes o WHERE o.event_id = w.id LIMIT 1) o ON true
        LEFT JOIN LATERAL (SELECT * FROM usage_voids v WHERE v.event_id = w.id LIMIT 1) v ON true
        -- Before this transaction: without the outcome and the void it wrote.
        CROSS JOIN LATERAL (SELECT CASE WHEN w.outcome THEN NULL ELSE o.status END,
                                   CASE WHEN w.outcome THEN NULL ELSE o.requests END,
                                   CASE WHEN w.outcome THEN NULL ELSE o.tokens END,
                                   CASE WHEN w.outcome THEN NULL ELSE o.credits END,
                                   CASE WHEN w.outcome THEN NULL ELSE o.cost_micros END
                           ) b(status, requests, tokens, credits, cost_micros)
        CROSS JOIN LATERAL usage_daily_event(w.id, coalesce(o.outcome_time, v.void_time)) e
        CROSS JOIN LATERAL (SELECT bills_nothing(o.status, v.event_id IS NOT NULL),
                                   bills_nothing(b.status, v.event_id IS NOT NULL AND NOT w.void)) n(now, was)));
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION usage_daily_flush() IS 'Counts into usage_daily what the current transaction queued in usage_daily_queue, and empties it.';

-- The trigger that flushes: at COMMIT, and before an UPDATE or DELETE of the three tables
-- changes a row (its AFTER trigger counts what it changed against the state before it).
-- +goose StatementBegin
CREATE FUNCTION usage_daily_on_flush() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM usage_daily_flush();
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- The trigger of usage_events: admissions inserted are queued; an UPDATE or DELETE is
-- counted at once: an event added bills what its outcome and void say, an event removed no
-- longer does.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_on_events() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO usage_daily_queue (kind, events)
        SELECT 'e', array_agg(ROW(event_id, path, (event_time AT TIME ZONE 'UTC')::date,
                                  requests, tokens, credits, cost_micros)::usage_daily_event)
        FROM new_rows
        HAVING count(*) > 0;
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        PERFORM usage_daily_lock(ARRAY(SELECT event_id FROM new_rows UNION SELECT event_id FROM old_rows), '{}');
        PERFORM usage_daily_add(ARRAY(
            SELECT ROW(e.path, (e.event_time AT TIME ZONE 'UTC')::date, 1,
                       billable_units(e.requests, o.requests, n.nothing), billable_units(e.tokens, o.tokens, n.nothing),
                       billable_units(e.credits, o.credits, n.nothing), billable_units(e.cost_micros, o.cost_micros, n.nothing)
                   )::usage_daily_change
            FROM new_rows e
            LEFT JOIN usage_outcomes o ON o.event_id = e.event_id
            LEFT JOIN usage_voids v ON v.event_id = e.event_id
            CROSS JOIN LATERAL (SELECT bills_nothing(o.status, v.event_id IS NOT NULL)) n(nothing)));
    ELSE
        PERFORM usage_daily_lock(ARRAY(SELECT event_id FROM old_rows), '{}');
    END IF;
    PERFORM usage_daily_add(ARRAY(
        SELECT ROW(e.path, (e.event_time AT TIME ZONE 'UTC')::date, -1,
                   -billable_units(e.requests, o.requests, n.nothing), -billable_units(e.tokens, o.tokens, n.nothing),
                   -billable_units(e.credits, o.credits, n.nothing), -billable_units(e.cost_micros, o.cost_micros, n.nothing)
               )::usage_daily_change
        FROM old_rows e
        LEFT JOIN usage_outcomes o ON o.event_id = e.event_id
        LEFT JOIN usage_voids v ON v.event_id = e.event_id
        CROSS JOIN LATERAL (SELECT bills_nothing(o.status, v.event_id IS NOT NULL)) n(nothing)));
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- The trigger of usage_outcomes: outcomes inserted are queued, those of a 2xx-4xx without
-- actual units left out (they change nothing their event bills, voided or not). An UPDATE
-- or DELETE is counted at once: each event whose outcome changed bills what its outcome says
-- now less what it said before.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_on_outcomes() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    ids text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO usage_daily_queue (kind, ids)
        SELECT 'o', array_agg(event_id)
        FROM new_rows o
        WHERE usage_daily_bills(o.status, o.requests, o.tokens, o.credits, o.cost_micros)
        HAVING count(*) > 0;
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        ids := ARRAY(SELECT event_id FROM new_rows UNION SELECT event_id FROM old_rows);
    ELSE
        ids := ARRAY(SELECT event_id FROM old_rows);
    END IF;
    PERFORM usage_daily_lock('{}', ids);
    PERFORM usage_daily_add(ARRAY(
        SELECT ROW(e.path, (e.event_time AT TIME ZONE 'UTC')::date, 0,
                   billable_units(e.requests, o.requests, n.now) - billable_units(e.requests, b.requests, n.was),
                   billable_units(e.tokens, o.tokens, n.now) - billable_units(e.tokens, b.tokens, n.was),
                   billable_units(e.credits, o.credits, n.now) - billable_units(e.credits, b.credits, n.was),
                   billable_units(e.cost_micros, o.cost_micros, n.now) - billable_units(e.cost_micros, b.cost_micros, n.was)
               )::usage_daily_change
        FROM usage_events e
        LEFT JOIN usage_outcomes o ON o.event_id = e.event_id
        LEFT JOIN old_rows b ON b.event_id = e.event_id
        LEFT JOIN usage_voids v ON v.event_id = e.event_id
        CROSS JOIN LATERAL (SELECT bills_nothing(o.status, v.event_id IS NOT NULL),
                                   bills_nothing(b.status, v.event_id IS NOT NULL)) n(now, was)
        WHERE e.event_id = ANY (ids)));
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- The trigger of usage_voids: voids inserted are queued. An UPDATE or DELETE is counted at
-- once: each event no longer voided bills again.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_on_voids() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    ids text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO usage_daily_queue (kind, ids)
        SELECT 'v', array_agg(event_id) FROM new_rows HAVING count(*) > 0;
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        ids := ARRAY(SELECT event_id FROM new_rows UNION SELECT event_id FROM old_rows);
    ELSE
        ids := ARRAY(SELECT event_id FROM old_rows);
    END IF;
    PERFORM usage_daily_lock('{}', ids);
    PERFORM usage_daily_add(ARRAY(
        SELECT ROW(e.path, (e.event_time AT TIME ZONE 'UTC')::date, 0,
                   billable_units(e.requests, o.requests, n.now) - billable_units(e.requests, o.requests, n.was),
                   billable_units(e.tokens, o.tokens, n.now) - billable_units(e.tokens, o.tokens, n.was),
                   billable_units(e.credits, o.credits, n.now) - billable_units(e.credits, o.credits, n.was),
                   billable_units(e.cost_micros, o.cost_micros, n.now) - billable_units(e.cost_micros, o.cost_micros, n.was)
               )::usage_daily_change
        FROM usage_events e
        LEFT JOIN usage_outcomes o ON o.event_id = e.event_id
        CROSS JOIN LATERAL (SELECT bills_nothing(o.status, EXISTS (SELECT 1 FROM usage_voids v WHERE v.event_id = e.event_id)),
                                   bills_nothing(o.status, EXISTS (SELECT 1 FROM old_rows b WHERE b.event_id = e.event_id))) n(now, was)
        WHERE e.event_id = ANY (ids)));
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Recomputes usage_daily from billable_events, after writes it did not see (see above).
-- Writers of the log wait for it (SHARE locks), and it for the fold in progress.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_rebuild() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE usage_events, usage_outcomes, usage_voids IN SHARE MODE;
    PERFORM pg_advisory_xact_lock(hashtextextended('metergate.usage_daily fold ' || current_schema(), 0));
    DELETE FROM usage_daily_queue; -- this transaction's: counted below
    DELETE FROM usage_daily_changes;
    DELETE FROM usage_daily_totals;
    INSERT INTO usage_daily_totals (account, day, events, requests, tokens, credits, cost_micros)
    SELECT a.account, (b.event_time AT TIME ZONE 'UTC')::date, count(*), sum(b.billable_requests),
           sum(b.billable_tokens), sum(b.billable_credits), sum(b.billable_cost_micros)
    FROM billable_events b
    CROSS JOIN LATERAL (SELECT DISTINCT x FROM unnest(b.path) x WHERE x IS NOT NULL) a(account)
    GROUP BY 1, 2;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION usage_daily_rebuild() IS 'Recomputes usage_daily from billable_events: after a TRUNCATE, or rows that reached the billing log without its triggers (a partition attached with rows).';

-- +goose StatementBegin
CREATE FUNCTION usage_daily_on_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM usage_daily_rebuild();
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- A trigger with transition tables is of one event. Those of usage_events are the
-- partitioned table's: they see the rows of every partition written through it.
CREATE TRIGGER usage_daily_insert AFTER INSERT ON usage_events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_events();
CREATE TRIGGER usage_daily_update AFTER UPDATE ON usage_events
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_events();
CREATE TRIGGER usage_daily_delete AFTER DELETE ON usage_events
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_events();
CREATE TRIGGER usage_daily_truncate AFTER TRUNCATE ON usage_events
    FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_truncate();

CREATE TRIGGER usage_daily_insert AFTER INSERT ON usage_outcomes
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_outcomes();
CREATE TRIGGER usage_daily_update AFTER UPDATE ON usage_outcomes
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_outcomes();
CREATE TRIGGER usage_daily_delete AFTER DELETE ON usage_outcomes
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_outcomes();
CREATE TRIGGER usage_daily_truncate AFTER TRUNCATE ON usage_outcomes
    FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_truncate();

CREATE TRIGGER usage_daily_insert AFTER INSERT ON usage_voids
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_voids();
CREATE TRIGGER usage_daily_update AFTER UPDATE ON usage_voids
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_voids();
CREATE TRIGGER usage_daily_delete AFTER DELETE ON usage_voids
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_voids();
CREATE TRIGGER usage_daily_truncate AFTER TRUNCATE ON usage_voids
    FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_truncate();

-- Flushes a transaction's queue when it commits (one firing per statement that queued:
-- the first flushes them all).
CREATE CONSTRAINT TRIGGER usage_daily_commit AFTER INSERT ON usage_daily_queue
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION usage_daily_on_flush();
CREATE TRIGGER usage_daily_flush BEFORE UPDATE OR DELETE ON usage_events
    FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_flush();
CREATE TRIGGER usage_daily_flush BEFORE UPDATE OR DELETE ON usage_outcomes
    FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_flush();
CREATE TRIGGER usage_daily_flush BEFORE UPDATE OR DELETE ON usage_voids
    FOR EACH STATEMENT EXECUTE FUNCTION usage_daily_on_flush();

-- The log written so far.
SELECT usage_daily_rebuild();

-- +goose Down
DROP TRIGGER usage_daily_truncate ON usage_voids;
DROP TRIGGER usage_daily_delete ON usage_voids;
DROP TRIGGER usage_daily_update ON usage_voids;
DROP TRIGGER usage_daily_insert ON usage_voids;
DROP TRIGGER usage_daily_truncate ON usage_outcomes;
DROP TRIGGER usage_daily_delete ON usage_outcomes;
DROP TRIGGER usage_daily_update ON usage_outcomes;
DROP TRIGGER usage_daily_insert ON usage_outcomes;
DROP TRIGGER usage_daily_truncate ON usage_events;
DROP TRIGGER usage_daily_delete ON usage_events;
DROP TRIGGER usage_daily_update ON usage_events;
DROP TRIGGER usage_daily_insert ON usage_events;
DROP TRIGGER usage_daily_flush ON usage_voids;
DROP TRIGGER usage_daily_flush ON usage_outcomes;
DROP TRIGGER usage_daily_flush ON usage_events;
DROP TRIGGER usage_daily_commit ON usage_daily_queue;
DROP FUNCTION usage_daily_on_truncate();
DROP FUNCTION usage_daily_rebuild();
DROP FUNCTION usage_daily_on_voids();
DROP FUNCTION usage_daily_on_outcomes();
DROP FUNCTION usage_daily_on_events();
DROP FUNCTION usage_daily_on_flush();
DROP FUNCTION usage_daily_flush();
DROP FUNCTION usage_daily_add(usage_daily_change[]);
DROP FUNCTION usage_daily_lock(text[], text[]);
DROP FUNCTION usage_daily_lock_limit();
DROP FUNCTION usage_daily_bills(integer, bigint, bigint, bigint, bigint);
DROP FUNCTION usage_daily_event(text, timestamptz);
DROP FUNCTION usage_daily_fold_odds();
DROP VIEW usage_daily;
DROP TYPE usage_daily_change;
DROP TABLE usage_daily_queue;
DROP TYPE usage_daily_event;
DROP TABLE usage_daily_changes;
DROP TABLE usage_daily_totals;
