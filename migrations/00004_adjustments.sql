-- +goose Up
-- The audit log of reconcile (internal/reconcile, cmd/reconcile): one row per run, and one row per
-- correction of one Redis quota counter. A correction is inserted first (ON CONFLICT DO
-- NOTHING), then applied to Redis exactly once (lua/adjust.lua writes a marker key named
-- after the row's id in the same script as the INCRBY), then marked applied. A run that dies
-- anywhere is finished by the next one: it applies every row whose applied_at is NULL, and
-- the unique keys below make a recomputed correction the row that is already there.

CREATE TABLE reconcile_runs (
    run_id      uuid        PRIMARY KEY,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    dry_run     boolean     NOT NULL DEFAULT false,
    summary     jsonb
);

COMMENT ON TABLE reconcile_runs IS 'One row per reconcile run; finished_at and summary stay NULL when the run died or failed.';
COMMENT ON COLUMN reconcile_runs.summary IS 'The run''s summary, as printed by reconcile --json.';

CREATE TABLE adjustments (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id       uuid        NOT NULL REFERENCES reconcile_runs (run_id),
    kind         text        NOT NULL CHECK (kind IN ('refund_5xx', 'settle_tokens', 'period_move', 'drift_restore')),
    org          text        NOT NULL,
    account      text        NOT NULL,
    level        text        NOT NULL,
    unit         text        NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    period       date        NOT NULL CHECK (extract(day FROM period) = 1),
    amount       bigint      NOT NULL CHECK (amount <> 0),
    redis_before bigint,
    redis_after  bigint,
    reason       text        NOT NULL,
    source_event text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    applied_at   timestamptz,
    CONSTRAINT adjustments_source_event CHECK ((kind = 'drift_restore') = (source_event IS NULL)),
    CONSTRAINT adjustments_applied CHECK ((applied_at IS NULL) = (redis_after IS NULL) AND (redis_before IS NULL) = (redis_after IS NULL))
);

-- An event-based correction is computable once: the same event, counter and kind is one row
-- whichever run computes it first.
CREATE UNIQUE INDEX adjustments_event_key ON adjustments (kind, source_event, account, unit, period)
    WHERE kind <> 'drift_restore';
-- A drift is measured by a run: at most one restore per counter and run (a later run that
-- finds the counter low again, e.g. after another Redis wipe, records a new one).
CREATE UNIQUE INDEX adjustments_drift_key ON adjustments (run_id, account, unit, period)
    WHERE kind = 'drift_restore';
-- What the next run has to finish.
CREATE INDEX adjustments_pending_idx ON adjustments (id) WHERE applied_at IS NULL;
CREATE INDEX adjustments_account_idx ON adjustments (account, period);

COMMENT ON TABLE adjustments IS 'Corrections of Redis quota counters by reconcile: one row per counter changed, applied exactly once.';
COMMENT ON COLUMN adjustments.id IS 'Also names the Redis marker key of the correction (<prefix>{shard}:adj:<id>), written in the same script as the counter change.';
COMMENT ON COLUMN adjustments.run_id IS 'The run that computed the correction (it may be applied by a later run if this one died).';
COMMENT ON COLUMN adjustments.kind IS 'refund_5xx: quota of a request whose outcome was a 5xx given back; settle_tokens: estimated units replaced by the actual ones of the outcome; period_move: usage charged to another month than its event time''s moved (two rows: minus from the charged month, plus to the right one); drift_restore: a counter below PostgreSQL''s billable total raised to it.';
COMMENT ON COLUMN adjustments.account IS 'The node whose counter is changed: one level of the request''s account path.';
COMMENT ON COLUMN adjustments.level IS 'Kind of that node: org, team, user or agent.';
COMMENT ON COLUMN adjustments.period IS 'First day of the month of the quota counter changed.';
COMMENT ON COLUMN adjustments.amount IS 'Delta added to the counter (negative gives quota back).';
COMMENT ON COLUMN adjustments.redis_before IS 'Counter value just before the change, as read by the script that changed it (NULL until applied).';
COMMENT ON COLUMN adjustments.redis_after IS 'Counter value just after the change (NULL until applied).';
COMMENT ON COLUMN adjustments.source_event IS 'usage_events.event_id the correction comes from; NULL for drift_restore.';
COMMENT ON COLUMN adjustments.applied_at IS 'When the row was marked applied; NULL while pending.';

-- +goose Down
DROP TABLE adjustments;
DROP TABLE reconcile_runs;
