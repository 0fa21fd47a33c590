-- +goose Up
-- What a request bills, defined once. Reconcile (its corrections and the totals verify and
-- drift compare counters with), the finance views and the invoices all read it from here:
--   - a request bills nothing when its outcome was a 5xx or it was voided (no caller was
--     told 200 for it);
--   - otherwise each unit bills the actual units its outcome reported, or the units admitted
--     (estimates) when it reported none.
-- Before this migration the finance views billed the admitted requests even when an outcome
-- reported its own, where reconcile settled the counters to the outcome's: now both bill the
-- outcome's.

-- Whether a request with this outcome status (NULL: none yet) bills nothing.
-- +goose StatementBegin
CREATE FUNCTION bills_nothing(outcome_status integer, voided boolean) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT coalesce(outcome_status >= 500, false) OR voided $$;
-- +goose StatementEnd

-- The units of one unit a request bills: admitted, the actual units reported (NULL: none),
-- and whether it bills nothing (bills_nothing).
-- +goose StatementBegin
CREATE FUNCTION billable_units(admitted bigint, actual bigint, nothing boolean) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN nothing THEN 0 ELSE coalesce(actual, admitted) END $$;
-- +goose StatementEnd

COMMENT ON FUNCTION bills_nothing(integer, boolean) IS 'Whether a request bills nothing: its outcome was a 5xx, or it was voided.';
COMMENT ON FUNCTION billable_units(bigint, bigint, boolean) IS 'Units a request bills of one unit: 0 when it bills nothing, else the outcome''s actual units when reported, else the admitted units.';

-- One row per admitted request with what it bills. Each event looks up its outcome by key:
-- usage_outcomes is not partitioned, and joined as a table PostgreSQL would hash every
-- outcome ever written for a query over one month; the LIMIT, a no-op on the key, keeps it a
-- lookup.
CREATE VIEW billable_events AS
SELECT e.event_id, e.org, e.account, e.path, e.plan, e.late, e.fail_open,
       e.charged_period, e.billing_period, e.event_time, e.ingest_time,
       o.status AS outcome_status, v.reason AS void_reason, n.nothing AS refunded,
       e.requests, e.tokens, e.credits, e.cost_micros,
       billable_units(e.requests, o.requests, n.nothing) AS billable_requests,
       billable_units(e.tokens, o.tokens, n.nothing) AS billable_tokens,
       billable_units(e.credits, o.credits, n.nothing) AS billable_credits,
       billable_units(e.cost_micros, o.cost_micros, n.nothing) AS billable_cost_micros
FROM usage_events e
LEFT JOIN LATERAL (SELECT * FROM usage_outcomes o WHERE o.event_id = e.event_id LIMIT 1) o ON true
LEFT JOIN usage_voids v ON v.event_id = e.event_id
CROSS JOIN LATERAL (SELECT bills_nothing(o.status, v.event_id IS NOT NULL) AS nothing) n;

COMMENT ON VIEW billable_events IS 'Each admitted request and what it bills (bills_nothing, billable_units): the one definition reconcile, the finance views and invoices use.';
COMMENT ON COLUMN billable_events.refunded IS 'Bills nothing: the outcome was a 5xx (outcome_status) or the request was voided (void_reason).';

-- The finance view keeps its columns (the views on it stay) and reads them from
-- billable_events.
CREATE OR REPLACE VIEW finance_billable_events AS
SELECT event_id, billing_period, event_time, ingest_time, org, account, path,
       array_to_string(path, '/') AS account_path, plan, late, outcome_status, refunded,
       requests, tokens, credits, cost_micros,
       billable_requests, billable_tokens, billable_credits, billable_cost_micros,
       void_reason IS NOT NULL AS voided
FROM billable_events;

COMMENT ON VIEW finance_billable_events IS 'Each admitted request and what it bills (billable_events): refunded requests (outcome 5xx, or voided: no caller was told 200) bill 0; every unit is settled to the outcome''s actual units when reported.';

-- +goose Down
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
DROP VIEW billable_events;
DROP FUNCTION billable_units(bigint, bigint, boolean);
DROP FUNCTION bills_nothing(integer, boolean);
