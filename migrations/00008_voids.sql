-- +goose Up
-- Requests no caller was told the decision of (admit answered 503 after a script call whose
-- outcome it does not know, or the caller hung up): written by the meter from
-- usage.voided events. A voided request bills nothing, and reconcile gives back what it
-- charged (refund_void). No foreign key, as for outcomes: a void may be metered before its
-- admission, or voids a request whose script call never ran.
CREATE TABLE usage_voids (
    event_id        text        PRIMARY KEY,
    attempt         text        NOT NULL,
    reason          text        NOT NULL CHECK (reason IN ('unavailable', 'caller_gone')),
    void_time       timestamptz NOT NULL,
    ingest_time     timestamptz NOT NULL DEFAULT now(),
    source          text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL
);

COMMENT ON TABLE usage_voids IS 'Admitted requests that no caller was told 200 for (CloudEvent io.metergate.usage.voided.v1): they bill nothing.';
COMMENT ON COLUMN usage_voids.attempt IS 'Event id of the request that was not answered: event_id itself, or the last request that replayed it by its idempotency key.';
COMMENT ON COLUMN usage_voids.reason IS 'unavailable: answered 503 after a Redis call whose outcome is unknown; caller_gone: the caller hung up before the answer.';

ALTER TABLE adjustments DROP CONSTRAINT adjustments_kind_check;
ALTER TABLE adjustments ADD CONSTRAINT adjustments_kind_check
    CHECK (kind IN ('refund_5xx', 'refund_void', 'settle_tokens', 'period_move', 'drift_restore'));
COMMENT ON COLUMN adjustments.kind IS 'refund_5xx: quota of a request whose outcome was a 5xx given back; refund_void: quota of a request no caller was told 200 for given back; settle_tokens: estimated units replaced by the actual ones of the outcome; period_move: usage charged to another month than its event time''s moved (two rows: minus from the charged month, plus to the right one); drift_restore: a counter below PostgreSQL''s billable total raised to it.';

-- What bills: a voided request bills nothing, like a refunded one. The columns are those of
-- 00005 with voided added last (CREATE OR REPLACE VIEW keeps the others as they are).
CREATE OR REPLACE VIEW finance_billable_events AS
SELECT e.event_id, e.billing_period, e.event_time, e.ingest_time, e.org, e.account, e.path,
       array_to_string(e.path, '/') AS account_path, e.plan, e.late,
       o.status AS outcome_status,
       coalesce(o.status >= 500, false) OR v.event_id IS NOT NULL AS refunded,
       e.requests, e.tokens, e.credits, e.cost_micros,
       CASE WHEN o.status >= 500 OR v.event_id IS NOT NULL THEN 0 ELSE e.requests END AS billable_requests,
       CASE WHEN o.status >= 500 OR v.event_id IS NOT NULL THEN 0 ELSE coalesce(o.tokens, e.tokens) END AS billable_tokens,
       CASE WHEN o.status >= 500 OR v.event_id IS NOT NULL THEN 0 ELSE coalesce(o.credits, e.credits) END AS billable_credits,
       CASE WHEN o.status >= 500 OR v.event_id IS NOT NULL THEN 0 ELSE coalesce(o.cost_micros, e.cost_micros) END AS billable_cost_micros,
       v.event_id IS NOT NULL AS voided
FROM usage_events e
LEFT JOIN usage_outcomes o ON o.event_id = e.event_id
LEFT JOIN usage_voids v ON v.event_id = e.event_id;

COMMENT ON VIEW finance_billable_events IS 'Each admitted request and what it bills: refunded requests (outcome 5xx, or voided: no caller was told 200) bill 0; tokens, credits and cost are settled to the outcome''s actual units when reported.';

-- +goose Down
-- A view's column cannot be dropped in place (CREATE OR REPLACE VIEW only adds): the views
-- built on finance_billable_events would have to go too. voided stays, always false.
CREATE OR REPLACE VIEW finance_billable_events AS
SELECT e.event_id, e.billing_period, e.event_time, e.ingest_time, e.org, e.account, e.path,
       array_to_string(e.path, '/') AS account_path, e.plan, e.late,
       o.status AS outcome_status,
       coalesce(o.status >= 500, false) AS refunded,
       e.requests, e.tokens, e.credits, e.cost_micros,
       CASE WHEN o.status >= 500 THEN 0 ELSE e.requests END AS billable_requests,
       CASE WHEN o.status >= 500 THEN 0 ELSE coalesce(o.tokens, e.tokens) END AS billable_tokens,
       CASE WHEN o.status >= 500 THEN 0 ELSE coalesce(o.credits, e.credits) END AS billable_credits,
       CASE WHEN o.status >= 500 THEN 0 ELSE coalesce(o.cost_micros, e.cost_micros) END AS billable_cost_micros,
       false AS voided
FROM usage_events e
LEFT JOIN usage_outcomes o ON o.event_id = e.event_id;
COMMENT ON VIEW finance_billable_events IS 'Each admitted request and what it bills: refunded (outcome 5xx) requests bill 0; tokens, credits and cost are settled to the outcome''s actual units when reported.';

-- Fails while refund_void corrections exist: they are audit rows, not to be dropped here.
ALTER TABLE adjustments DROP CONSTRAINT adjustments_kind_check;
ALTER TABLE adjustments ADD CONSTRAINT adjustments_kind_check
    CHECK (kind IN ('refund_5xx', 'settle_tokens', 'period_move', 'drift_restore'));
COMMENT ON COLUMN adjustments.kind IS 'refund_5xx: quota of a request whose outcome was a 5xx given back; settle_tokens: estimated units replaced by the actual ones of the outcome; period_move: usage charged to another month than its event time''s moved (two rows: minus from the charged month, plus to the right one); drift_restore: a counter below PostgreSQL''s billable total raised to it.';

DROP TABLE usage_voids;
