-- +goose Up
-- Amendments of closed periods' usage (issue 31): an operator voids recorded events, or sets
-- the units they bill, with a reason. Nothing in the billing log is rewritten: an amendment
-- is a row, and finance_billable_events (what invoices, credits and the finance views bill)
-- reads each event's latest amendment. Quota counters (billable_events, reconcile) are not
-- amended: they count what was used; an amendment changes what is billed. The difference
-- is billed on the org's next invoice (a correction) or at once by a credit note.

CREATE TABLE amendments (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    org            text        NOT NULL,
    billing_period date        NOT NULL REFERENCES periods (period),
    action         text        NOT NULL CHECK (action IN ('void', 'set_units')),
    requests       bigint CHECK (requests BETWEEN 0 AND 1000000000000000),
    tokens         bigint CHECK (tokens BETWEEN 0 AND 1000000000000000),
    credits        bigint CHECK (credits BETWEEN 0 AND 1000000000000000),
    cost_micros    bigint CHECK (cost_micros BETWEEN 0 AND 1000000000000000),
    reason         text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    settle         text        NOT NULL CHECK (settle IN ('credit_note', 'next_invoice')),
    events         integer     NOT NULL CHECK (events >= 1),
    amended_by     text        NOT NULL,
    amended_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT amendments_units CHECK ((action = 'void') =
        (requests IS NULL AND tokens IS NULL AND credits IS NULL AND cost_micros IS NULL))
);

CREATE INDEX amendments_amended_at_idx ON amendments (amended_at);

COMMENT ON TABLE amendments IS 'An operator''s amendment of recorded events of a closed period (amendment_events): void them (they bill nothing) or set the units they bill (NULL: unchanged), with a reason and how the difference is settled. Append-only; an event''s latest amendment counts.';

CREATE TABLE amendment_events (
    amendment_id   bigint NOT NULL REFERENCES amendments (id),
    event_id       text   NOT NULL,
    billing_period date   NOT NULL,
    PRIMARY KEY (event_id, billing_period, amendment_id)
);

COMMENT ON TABLE amendment_events IS 'The events an amendment amends (append-only).';

CREATE TRIGGER amendments_append_only BEFORE UPDATE OR DELETE ON amendments
    FOR EACH ROW EXECUTE FUNCTION append_only('an amendment is a row of the books; a later one supersedes it');
CREATE TRIGGER amendments_no_truncate BEFORE TRUNCATE ON amendments
    FOR EACH STATEMENT EXECUTE FUNCTION append_only('an amendment is a row of the books; a later one supersedes it');
CREATE TRIGGER amendment_events_append_only BEFORE UPDATE OR DELETE ON amendment_events
    FOR EACH ROW EXECUTE FUNCTION append_only('an amendment is a row of the books; a later one supersedes it');
CREATE TRIGGER amendment_events_no_truncate BEFORE TRUNCATE ON amendment_events
    FOR EACH STATEMENT EXECUTE FUNCTION append_only('an amendment is a row of the books; a later one supersedes it');

-- Each amended event and its latest amendment.
CREATE VIEW amended_events AS
SELECT DISTINCT ON (ae.event_id, ae.billing_period)
       ae.event_id, ae.billing_period, a.id AS amendment_id, a.action, a.requests, a.tokens, a.credits, a.cost_micros
FROM amendment_events ae
JOIN amendments a ON a.id = ae.amendment_id
ORDER BY ae.event_id, ae.billing_period, a.id DESC;

COMMENT ON VIEW amended_events IS 'Each amended event with its latest amendment: what it bills from then on.';

-- What is billed, amendments applied (the columns stay: amended_events says which are).
CREATE OR REPLACE VIEW finance_billable_events AS
SELECT b.event_id, b.billing_period, b.event_time, b.ingest_time, b.org, b.account, b.path,
       array_to_string(b.path, '/') AS account_path, b.plan, b.late, b.outcome_status,
       b.refunded OR coalesce(a.action = 'void', false) AS refunded,
       b.requests, b.tokens, b.credits, b.cost_micros,
       CASE WHEN a.action = 'void' THEN 0 ELSE coalesce(a.requests, b.billable_requests) END AS billable_requests,
       CASE WHEN a.action = 'void' THEN 0 ELSE coalesce(a.tokens, b.billable_tokens) END AS billable_tokens,
       CASE WHEN a.action = 'void' THEN 0 ELSE coalesce(a.credits, b.billable_credits) END AS billable_credits,
       CASE WHEN a.action = 'void' THEN 0 ELSE coalesce(a.cost_micros, b.billable_cost_micros) END AS billable_cost_micros,
       b.void_reason IS NOT NULL AS voided
FROM billable_events b
LEFT JOIN amended_events a ON a.event_id = b.event_id AND a.billing_period = b.billing_period;

COMMENT ON VIEW finance_billable_events IS 'Each admitted request and what it bills (billable_events, then its latest amendment): refunded requests (outcome 5xx, voided: no caller was told 200, or voided by an amendment) bill 0; every unit is settled to the outcome''s actual units when reported, or set by an amendment (amended_events).';

-- A credit note may settle an amendment: it credits the difference on the period's live
-- invoice at once, and counts as billed (negatively) for the period.
ALTER TABLE credit_notes
    ADD COLUMN amendment_id bigint UNIQUE REFERENCES amendments (id),
    DROP CONSTRAINT credit_notes_kind_check,
    ADD CONSTRAINT credit_notes_kind_check CHECK (kind IN ('void', 'amendment')),
    ADD CONSTRAINT credit_notes_amendment CHECK ((kind = 'amendment') = (amendment_id IS NOT NULL));

COMMENT ON COLUMN credit_notes.amendment_id IS 'kind amendment: the amendment whose difference it credits, once.';

-- Finding what changed since the last close in months past the correction window: outcomes
-- and voids by ingest time (BRIN: small, and these tables are written in time order).
CREATE INDEX usage_outcomes_ingest_time_idx ON usage_outcomes USING brin (ingest_time);
CREATE INDEX usage_voids_ingest_time_idx ON usage_voids USING brin (ingest_time);

-- +goose Down
DROP INDEX usage_voids_ingest_time_idx;
DROP INDEX usage_outcomes_ingest_time_idx;
ALTER TABLE credit_notes
    DROP CONSTRAINT credit_notes_amendment,
    DROP CONSTRAINT credit_notes_kind_check,
    ADD CONSTRAINT credit_notes_kind_check CHECK (kind IN ('void')),
    DROP COLUMN amendment_id;
CREATE OR REPLACE VIEW finance_billable_events AS
SELECT b.event_id, b.billing_period, b.event_time, b.ingest_time, b.org, b.account, b.path,
       array_to_string(b.path, '/') AS account_path, b.plan, b.late, b.outcome_status, b.refunded,
       b.requests, b.tokens, b.credits, b.cost_micros,
       b.billable_requests, b.billable_tokens, b.billable_credits, b.billable_cost_micros,
       b.void_reason IS NOT NULL AS voided
FROM billable_events b;
DROP VIEW amended_events;
DROP TABLE amendment_events;
DROP TABLE amendments;
