-- +goose Up
-- Usage per account and UTC day (issue 33): what the customer portal and the console's
-- account chart read, where summing the billing log's rows would read millions of them for
-- a year of one org. It is exact at every commit: for every account A and UTC day D the
-- view usage_daily holds what billable_events sums over its events e with
-- e.path @> ARRAY[A] and (e.event_time AT TIME ZONE 'UTC')::date = D: count(*) as events,
-- and billable_requests, billable_tokens, billable_credits and billable_cost_micros.
--
-- Statement triggers keep it: each INSERT, UPDATE or DELETE of usage_events, usage_outcomes
-- or usage_voids adds, to every account on the path of each event it changes and the
-- event's day, what the event bills after the statement less what it billed before
-- (bills_nothing and billable_units of 00009: the rule is the view's). Three choices:
--
-- 1. The triggers append their changes to usage_daily_changes, and one transaction at a
--    time (the one that finds the fold lock free) folds them into usage_daily_totals; the
--    view adds the two. Upserting the totals from every trigger would make the meter's
--    writers wait on one another's (org, day) rows until each commits, and deadlock when
--    one's admissions and another's outcomes reach the same rows in opposite orders.
-- 2. An outcome or a void may be written before its admission, or at the same time by
--    another transaction: whichever commits second must see the first. So each statement
--    first locks the events it changes (advisory transaction locks keyed by event id:
--    shared for usage_events, exclusive for outcomes and voids), then reads the other
--    tables in a statement of its own, whose snapshot (READ COMMITTED) holds what the
--    transaction it waited for committed. Past usage_daily_lock_limit event locks in one
--    transaction (PostgreSQL's lock table is bounded), it takes the schema's writers' lock
--    exclusively instead: a bulk load waits for every other writer and they for it.
-- 3. TRUNCATE rebuilds the rollup from the log (usage_daily_rebuild). Rows that reach the
--    log without a trigger (a partition attached with rows in it, or written directly
--    rather than through usage_events) are not in it until usage_daily_rebuild() runs.

-- Accounts sort bytewise ("C"): the fold sorts and looks up hundreds of them per batch of
-- the meter, and a locale's comparisons cost several times as much.
CREATE TABLE usage_daily_totals (
    account     text   COLLATE "C" NOT NULL,
    day         date   NOT NULL,
    events      bigint NOT NULL,
    requests    bigint NOT NULL,
    tokens      bigint NOT NULL,
    credits     bigint NOT NULL,
    cost_micros bigint NOT NULL,
    PRIMARY KEY (account, day)
);

-- No key and no index: rows are only ever appended by the triggers, a few hundred per
-- statement of the meter, and removed all at once by the fold; a reader scans the few
-- thousand not folded yet.
CREATE TABLE usage_daily_changes (
    account     text   COLLATE "C" NOT NULL,
    day         date   NOT NULL,
    events      bigint NOT NULL,
    requests    bigint NOT NULL,
    tokens      bigint NOT NULL,
    credits     bigint NOT NULL,
    cost_micros bigint NOT NULL
);

COMMENT ON TABLE usage_daily_totals IS 'Folded part of usage_daily: one row per account and UTC day, written only by the fold (usage_daily_add) and usage_daily_rebuild.';
COMMENT ON TABLE usage_daily_changes IS 'Part of usage_daily not folded into usage_daily_totals yet: signed changes appended by the triggers of usage_events, usage_outcomes and usage_voids.';

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
SELECT account, day, sum(events)::bigint AS events, sum(requests)::bigint AS requests,
       sum(tokens)::bigint AS tokens, sum(credits)::bigint AS credits, sum(cost_micros)::bigint AS cost_micros
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

-- Locks the events of a statement for its trigger, until the transaction ends: shared
-- (admissions: an event is inserted once) or exclusive (outcomes and voids), in one order
-- (keys sorted), after a shared lock of the schema's writers. A transaction past
-- usage_daily_lock_limit locks takes the writers' lock exclusively instead, and keeps it;
-- the setting metergate.usage_daily_locks counts its locks (-1: exclusive).
-- +goose StatementBegin
CREATE FUNCTION usage_daily_lock(event_ids text[], exclusive boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    writers bigint := hashtextextended('metergate.usage_daily writers ' || current_schema(), 0);
    seed    bigint := hashtext('metergate.usage_daily events ' || current_schema());
    held    bigint := coalesce(nullif(current_setting('metergate.usage_daily_locks', true), ''), '0')::bigint;
BEGIN
    IF cardinality(event_ids) = 0 THEN
        RETURN;
    END IF;
    IF held < 0 OR held + cardinality(event_ids) > usage_daily_lock_limit() THEN
        PERFORM pg_advisory_xact_lock(writers);
        PERFORM set_config('metergate.usage_daily_locks', '-1', true);
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(writers);
    IF exclusive THEN
        PERFORM pg_advisory_xact_lock(k)
        FROM (SELECT DISTINCT hashtextextended(id, seed) AS k FROM unnest(event_ids) id ORDER BY 1) s;
    ELSE
        PERFORM pg_advisory_xact_lock_shared(k)
        FROM (SELECT DISTINCT hashtextextended(id, seed) AS k FROM unnest(event_ids) id ORDER BY 1) s;
    END IF;
    PERFORM set_config('metergate.usage_daily_locks', (held + cardinality(event_ids))::text, true);
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION usage_daily_lock(text[], boolean) IS 'Locks events (shared or exclusive) until the transaction ends, for the triggers of usage_daily; past usage_daily_lock_limit() locks, the schema''s writers'' lock exclusively instead.';

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

-- The trigger of usage_events: an event added bills what its outcome and void (already
-- written) say, an event removed no longer does.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_on_events() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM usage_daily_lock(ARRAY(SELECT event_id FROM new_rows), false);
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM usage_daily_lock(ARRAY(SELECT event_id FROM new_rows UNION SELECT event_id FROM old_rows), false);
    ELSE
        PERFORM usage_daily_lock(ARRAY(SELECT event_id FROM old_rows), false);
    END IF;
    -- A statement of its own after the locks: its snapshot is taken after them.
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM usage_daily_add(ARRAY(
            SELECT ROW(e.path, (e.event_time AT TIME ZONE 'UTC')::date, 1,
                       billable_units(e.requests, o.requests, n.nothing), billable_units(e.tokens, o.tokens, n.nothing),
                       billable_units(e.credits, o.credits, n.nothing), billable_units(e.cost_micros, o.cost_micros, n.nothing)
                   )::usage_daily_change
            FROM new_rows e
            LEFT JOIN (SELECT * FROM usage_outcomes WHERE event_id = ANY (ARRAY(SELECT event_id FROM new_rows))) o ON o.event_id = e.event_id
            LEFT JOIN (SELECT event_id FROM usage_voids WHERE event_id = ANY (ARRAY(SELECT event_id FROM new_rows))) v ON v.event_id = e.event_id
            CROSS JOIN LATERAL (SELECT bills_nothing(o.status, v.event_id IS NOT NULL)) n(nothing)));
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM usage_daily_add(ARRAY(
            SELECT ROW(e.path, (e.event_time AT TIME ZONE 'UTC')::date, -1,
                       -billable_units(e.requests, o.requests, n.nothing), -billable_units(e.tokens, o.tokens, n.nothing),
                       -billable_units(e.credits, o.credits, n.nothing), -billable_units(e.cost_micros, o.cost_micros, n.nothing)
                   )::usage_daily_change
            FROM old_rows e
            LEFT JOIN (SELECT * FROM usage_outcomes WHERE event_id = ANY (ARRAY(SELECT event_id FROM old_rows))) o ON o.event_id = e.event_id
            LEFT JOIN (SELECT event_id FROM usage_voids WHERE event_id = ANY (ARRAY(SELECT event_id FROM old_rows))) v ON v.event_id = e.event_id
            CROSS JOIN LATERAL (SELECT bills_nothing(o.status, v.event_id IS NOT NULL)) n(nothing)));
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

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

-- The trigger of usage_outcomes: each event whose outcome changed bills what its outcome
-- says now less what its outcome said before (none, for an outcome inserted). Events not
-- written yet change nothing: their trigger reads the outcome.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_on_outcomes() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    ids text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- An outcome of a 2xx-4xx without actual units changes nothing its event bills,
        -- voided or not: it is neither locked nor looked up.
        PERFORM usage_daily_lock(ARRAY(SELECT event_id FROM new_rows o WHERE usage_daily_bills(o.status, o.requests, o.tokens, o.credits, o.cost_micros)), true);
        PERFORM usage_daily_add(ARRAY(
            SELECT ROW(e.path, (e.event_time AT TIME ZONE 'UTC')::date, 0,
                       billable_units(e.requests, o.requests, n.now) - billable_units(e.requests, NULL, n.was),
                       billable_units(e.tokens, o.tokens, n.now) - billable_units(e.tokens, NULL, n.was),
                       billable_units(e.credits, o.credits, n.now) - billable_units(e.credits, NULL, n.was),
                       billable_units(e.cost_micros, o.cost_micros, n.now) - billable_units(e.cost_micros, NULL, n.was)
                   )::usage_daily_change
            FROM new_rows o
            CROSS JOIN LATERAL usage_daily_event(o.event_id, o.outcome_time) e
            LEFT JOIN LATERAL (SELECT true AS voided FROM usage_voids v WHERE v.event_id = o.event_id LIMIT 1) v ON true
            CROSS JOIN LATERAL (SELECT bills_nothing(o.status, v.voided IS NOT NULL),
                                       bills_nothing(NULL, v.voided IS NOT NULL)) n(now, was)
            WHERE usage_daily_bills(o.status, o.requests, o.tokens, o.credits, o.cost_micros)));
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        ids := ARRAY(SELECT event_id FROM new_rows UNION SELECT event_id FROM old_rows);
    ELSE
        ids := ARRAY(SELECT event_id FROM old_rows);
    END IF;
    PERFORM usage_daily_lock(ids, true);
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

-- The trigger of usage_voids: each event voided bills nothing from now on, each event no
-- longer voided bills again.
-- +goose StatementBegin
CREATE FUNCTION usage_daily_on_voids() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    ids text[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM usage_daily_lock(ARRAY(SELECT event_id FROM new_rows), true);
        PERFORM usage_daily_add(ARRAY(
            SELECT ROW(e.path, (e.event_time AT TIME ZONE 'UTC')::date, 0,
                       -billable_units(e.requests, o.requests, n.was), -billable_units(e.tokens, o.tokens, n.was),
                       -billable_units(e.credits, o.credits, n.was), -billable_units(e.cost_micros, o.cost_micros, n.was)
                   )::usage_daily_change
            FROM new_rows v
            CROSS JOIN LATERAL usage_daily_event(v.event_id, v.void_time) e
            LEFT JOIN LATERAL (SELECT * FROM usage_outcomes o WHERE o.event_id = v.event_id LIMIT 1) o ON true
            CROSS JOIN LATERAL (SELECT bills_nothing(o.status, false)) n(was)));
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        ids := ARRAY(SELECT event_id FROM new_rows UNION SELECT event_id FROM old_rows);
    ELSE
        ids := ARRAY(SELECT event_id FROM old_rows);
    END IF;
    PERFORM usage_daily_lock(ids, true);
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
DROP FUNCTION usage_daily_on_truncate();
DROP FUNCTION usage_daily_rebuild();
DROP FUNCTION usage_daily_on_voids();
DROP FUNCTION usage_daily_on_outcomes();
DROP FUNCTION usage_daily_on_events();
DROP FUNCTION usage_daily_add(usage_daily_change[]);
DROP FUNCTION usage_daily_lock(text[], boolean);
DROP FUNCTION usage_daily_lock_limit();
DROP FUNCTION usage_daily_bills(integer, bigint, bigint, bigint, bigint);
DROP FUNCTION usage_daily_event(text, timestamptz);
DROP FUNCTION usage_daily_fold_odds();
DROP VIEW usage_daily;
DROP TYPE usage_daily_change;
DROP TABLE usage_daily_changes;
DROP TABLE usage_daily_totals;
