-- +goose Up
-- Invoices and prepaid credits (issue 18). Usage that the org's own credit grants paid for
-- is not billed again by the plan's tiers:
--
--   covered units of a request and unit = least(what it drew, net of reconcile's refund and
--       settle rows, from grants of its org's own account; what it bills of the unit)
--   an invoice prices, per unit, billable - covered (its included units and tiers apply to
--       that), and shows the covered units as a credits_applied line of amount 0.
--
-- Grants of accounts below the org (a team's budget) are internal allocations: their draws
-- change no invoice. Capping a request's covered units at what it bills makes them the net
-- draw once reconcile has settled it, and the same before (a 5xx whose refund is not
-- written yet covers nothing, since it bills nothing), so a close never depends on whether
-- reconcile ran first.

ALTER TABLE invoice_lines DROP CONSTRAINT invoice_lines_kind_check;
ALTER TABLE invoice_lines ADD CONSTRAINT invoice_lines_kind_check
    CHECK (kind IN ('base_fee', 'usage', 'included', 'overage_tier', 'adjustment', 'late', 'credits_applied'));

COMMENT ON COLUMN invoice_lines.kind IS 'base_fee, usage (the breakdown, amount 0), credits_applied (units the org''s prepaid credits covered, amount 0), included, overage_tier, late and adjustment (for_period: a closed period''s late units and corrections).';

CREATE INDEX credit_consumptions_period_idx ON credit_consumptions (billing_period, org);

CREATE VIEW credits_covered AS
SELECT b.event_id, b.billing_period, b.org, b.account_path, b.late, b.ingest_time, d.unit, d.drawn,
       greatest(0, least(d.drawn, CASE d.unit WHEN 'requests' THEN b.billable_requests WHEN 'tokens' THEN b.billable_tokens
                                              WHEN 'credits' THEN b.billable_credits ELSE b.billable_cost_micros END))::bigint AS covered
FROM (
    SELECT c.event_id, c.billing_period, c.unit, sum(c.units - coalesce(a.units, 0)) AS drawn
    FROM credit_consumptions c
    JOIN credit_grants g ON g.id = c.grant_id AND g.account = c.org
    CROSS JOIN LATERAL (
        SELECT sum(a.units) AS units FROM credit_adjustments a
        WHERE a.event_id = c.event_id AND a.grant_id = c.grant_id AND a.kind IN ('refund', 'settle')
    ) a
    GROUP BY c.event_id, c.billing_period, c.unit
) d
JOIN finance_billable_events b ON b.event_id = d.event_id AND b.billing_period = d.billing_period;

COMMENT ON VIEW credits_covered IS 'Per request and unit that drew from grants of its org''s own account: drawn (net of refund and settle rows) and covered = least(drawn, the units it bills): what its invoice does not bill again. Draws from grants below the org are not here.';

-- The tie-out with credits. finance_period_billing keeps its columns and adds covered
-- (units the period''s covered and billed late events had covered by the org''s credits,
-- today) and billed_covered (credits_applied lines for the period); billed_amount must be
-- price_usage(billed_quantity - billed_covered).
CREATE OR REPLACE VIEW finance_period_billing AS
WITH billable AS (
    SELECT b.org, b.billing_period AS period, u.unit,
           sum(CASE u.unit WHEN 'requests' THEN b.billable_requests WHEN 'tokens' THEN b.billable_tokens
                           WHEN 'credits' THEN b.billable_credits ELSE b.billable_cost_micros END) AS quantity
    FROM finance_billable_events b
    JOIN periods p ON p.period = b.billing_period
    LEFT JOIN invoice_late_events l ON l.event_id = b.event_id AND l.billing_period = b.billing_period
    CROSS JOIN (VALUES ('requests'), ('tokens'), ('credits'), ('cost_micros')) AS u (unit)
    WHERE (NOT b.late AND b.ingest_time <= p.closed_at) OR l.invoice_id IS NOT NULL
    GROUP BY b.org, b.billing_period, u.unit
), covered AS (
    SELECT c.org, c.billing_period AS period, c.unit, sum(c.covered) AS quantity
    FROM credits_covered c
    JOIN periods p ON p.period = c.billing_period
    LEFT JOIN invoice_late_events l ON l.event_id = c.event_id AND l.billing_period = c.billing_period
    WHERE (NOT c.late AND c.ingest_time <= p.closed_at) OR l.invoice_id IS NOT NULL
    GROUP BY c.org, c.billing_period, c.unit
), billed AS (
    SELECT i.org, coalesce(l.for_period, i.period) AS period, l.unit,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind IN ('usage', 'late', 'adjustment')), 0) AS quantity,
           coalesce(sum(l.amount_minor) FILTER (WHERE l.kind IN ('included', 'overage_tier', 'late', 'adjustment')), 0) AS amount,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind = 'credits_applied'), 0) AS covered
    FROM invoices i
    JOIN invoice_lines l ON l.invoice_id = i.id
    WHERE l.unit IS NOT NULL
    GROUP BY i.org, coalesce(l.for_period, i.period), l.unit
)
SELECT i.id AS invoice_id, i.org, i.period, i.plan, i.price_version, pu.unit,
       coalesce(bl.quantity, 0)::bigint AS billable_quantity,
       coalesce(bd.quantity, 0)::bigint AS billed_quantity,
       coalesce(bd.amount, 0)::bigint AS billed_amount,
       coalesce(cv.quantity, 0)::bigint AS covered_quantity,
       coalesce(bd.covered, 0)::bigint AS billed_covered
FROM invoices i
JOIN plan_price_units pu ON pu.plan = i.plan AND pu.version = i.price_version
LEFT JOIN billable bl ON bl.org = i.org AND bl.period = i.period AND bl.unit = pu.unit
LEFT JOIN covered cv ON cv.org = i.org AND cv.period = i.period AND cv.unit = pu.unit
LEFT JOIN billed bd ON bd.org = i.org AND bd.period = i.period AND bd.unit = pu.unit;

COMMENT ON VIEW finance_period_billing IS 'Per closed period, org and billed unit of the invoice''s price version: billable units now (covered events and billed late events, today''s outcomes) and the units of them the org''s credits covered (covered_quantity), against units, amounts and credits applied billed for the period on its invoice and later ones (late, adjustment and credits_applied lines).';

CREATE OR REPLACE VIEW finance_invoice_tieout AS
WITH lines AS (
    SELECT invoice_id, sum(amount_minor) AS amount FROM invoice_lines GROUP BY invoice_id
), by_unit AS (
    SELECT i.id AS invoice_id, i.org, i.period, i.plan, i.price_version, pu.unit,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind = 'usage'), 0) AS usage_qty,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind IN ('included', 'overage_tier')
                                               OR (l.kind = 'credits_applied' AND l.for_period IS NULL)), 0) AS priced_qty,
           coalesce(sum(l.amount_minor) FILTER (WHERE l.kind IN ('included', 'overage_tier')), 0) AS priced_amount,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind = 'credits_applied' AND l.for_period IS NULL), 0) AS covered_qty
    FROM invoices i
    JOIN plan_price_units pu ON pu.plan = i.plan AND pu.version = i.price_version
    LEFT JOIN invoice_lines l ON l.invoice_id = i.id AND l.unit = pu.unit
    GROUP BY i.id, i.org, i.period, i.plan, i.price_version, pu.unit
)
SELECT i.id AS invoice_id, i.org, i.period, 'total = subtotal' AS "check", NULL::text AS unit,
       i.subtotal_minor::numeric AS expected, i.total_minor::numeric AS actual
FROM invoices i WHERE i.total_minor <> i.subtotal_minor
UNION ALL
SELECT i.id, i.org, i.period, 'subtotal = sum of lines', NULL, coalesce(l.amount, 0), i.subtotal_minor
FROM invoices i LEFT JOIN lines l ON l.invoice_id = i.id
WHERE i.subtotal_minor <> coalesce(l.amount, 0)
UNION ALL
SELECT u.invoice_id, u.org, u.period, 'included + overage quantity = usage', u.unit, u.usage_qty, u.priced_qty
FROM by_unit u WHERE u.priced_qty <> u.usage_qty
UNION ALL
SELECT u.invoice_id, u.org, u.period, 'overage amount = price_usage(usage)', u.unit,
       price_usage(u.plan, u.price_version, u.unit, u.usage_qty - u.covered_qty), u.priced_amount
FROM by_unit u WHERE u.priced_amount <> price_usage(u.plan, u.price_version, u.unit, u.usage_qty - u.covered_qty)
UNION ALL
SELECT b.invoice_id, b.org, b.period, 'billed for the period = billable usage', b.unit, b.billable_quantity, b.billed_quantity
FROM finance_period_billing b WHERE b.billed_quantity <> b.billable_quantity
UNION ALL
SELECT b.invoice_id, b.org, b.period, 'amount billed for the period = price_usage(billed)', b.unit,
       price_usage(b.plan, b.price_version, b.unit, b.billed_quantity - b.billed_covered), b.billed_amount
FROM finance_period_billing b WHERE b.billed_amount <> price_usage(b.plan, b.price_version, b.unit, b.billed_quantity - b.billed_covered)
UNION ALL
SELECT b.invoice_id, b.org, b.period, 'credits applied for the period = covered usage', b.unit, b.covered_quantity, b.billed_covered
FROM finance_period_billing b WHERE b.billed_covered <> b.covered_quantity;

COMMENT ON VIEW finance_invoice_tieout IS 'Invoice tie-out: one row per difference (total vs subtotal, subtotal vs lines, credits applied + included + overage quantity vs usage lines, amounts vs price_usage of usage less credits applied, units and credits applied for a period vs its billable and covered usage now). Empty when every invoice ties out; a billed/billable or applied/covered difference after a close is a correction the next close bills.';

-- +goose Down
-- Fails (changing nothing) once an invoice has a credits_applied line: issued invoices are
-- not rewritten.
DROP VIEW finance_invoice_tieout;
DROP VIEW finance_period_billing;

CREATE VIEW finance_period_billing AS
WITH billable AS (
    SELECT b.org, b.billing_period AS period, u.unit,
           sum(CASE u.unit WHEN 'requests' THEN b.billable_requests WHEN 'tokens' THEN b.billable_tokens
                           WHEN 'credits' THEN b.billable_credits ELSE b.billable_cost_micros END) AS quantity
    FROM finance_billable_events b
    JOIN periods p ON p.period = b.billing_period
    LEFT JOIN invoice_late_events l ON l.event_id = b.event_id AND l.billing_period = b.billing_period
    CROSS JOIN (VALUES ('requests'), ('tokens'), ('credits'), ('cost_micros')) AS u (unit)
    WHERE (NOT b.late AND b.ingest_time <= p.closed_at) OR l.invoice_id IS NOT NULL
    GROUP BY b.org, b.billing_period, u.unit
), billed AS (
    SELECT i.org, coalesce(l.for_period, i.period) AS period, l.unit,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind IN ('usage', 'late', 'adjustment')), 0) AS quantity,
           coalesce(sum(l.amount_minor) FILTER (WHERE l.kind IN ('included', 'overage_tier', 'late', 'adjustment')), 0) AS amount
    FROM invoices i
    JOIN invoice_lines l ON l.invoice_id = i.id
    WHERE l.unit IS NOT NULL
    GROUP BY i.org, coalesce(l.for_period, i.period), l.unit
)
SELECT i.id AS invoice_id, i.org, i.period, i.plan, i.price_version, pu.unit,
       coalesce(bl.quantity, 0)::bigint AS billable_quantity,
       coalesce(bd.quantity, 0)::bigint AS billed_quantity,
       coalesce(bd.amount, 0)::bigint AS billed_amount
FROM invoices i
JOIN plan_price_units pu ON pu.plan = i.plan AND pu.version = i.price_version
LEFT JOIN billable bl ON bl.org = i.org AND bl.period = i.period AND bl.unit = pu.unit
LEFT JOIN billed bd ON bd.org = i.org AND bd.period = i.period AND bd.unit = pu.unit;

COMMENT ON VIEW finance_period_billing IS 'Per closed period, org and billed unit of the invoice''s price version: billable units now (covered events and billed late events, today''s outcomes) against units and amounts billed for the period on its invoice and later ones (late and adjustment lines).';

CREATE VIEW finance_invoice_tieout AS
WITH lines AS (
    SELECT invoice_id, sum(amount_minor) AS amount FROM invoice_lines GROUP BY invoice_id
), by_unit AS (
    SELECT i.id AS invoice_id, i.org, i.period, i.plan, i.price_version, pu.unit,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind = 'usage'), 0) AS usage_qty,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind IN ('included', 'overage_tier')), 0) AS priced_qty,
           coalesce(sum(l.amount_minor) FILTER (WHERE l.kind IN ('included', 'overage_tier')), 0) AS priced_amount
    FROM invoices i
    JOIN plan_price_units pu ON pu.plan = i.plan AND pu.version = i.price_version
    LEFT JOIN invoice_lines l ON l.invoice_id = i.id AND l.unit = pu.unit
    GROUP BY i.id, i.org, i.period, i.plan, i.price_version, pu.unit
)
SELECT i.id AS invoice_id, i.org, i.period, 'total = subtotal' AS "check", NULL::text AS unit,
       i.subtotal_minor::numeric AS expected, i.total_minor::numeric AS actual
FROM invoices i WHERE i.total_minor <> i.subtotal_minor
UNION ALL
SELECT i.id, i.org, i.period, 'subtotal = sum of lines', NULL, coalesce(l.amount, 0), i.subtotal_minor
FROM invoices i LEFT JOIN lines l ON l.invoice_id = i.id
WHERE i.subtotal_minor <> coalesce(l.amount, 0)
UNION ALL
SELECT u.invoice_id, u.org, u.period, 'included + overage quantity = usage', u.unit, u.usage_qty, u.priced_qty
FROM by_unit u WHERE u.priced_qty <> u.usage_qty
UNION ALL
SELECT u.invoice_id, u.org, u.period, 'overage amount = price_usage(usage)', u.unit,
       price_usage(u.plan, u.price_version, u.unit, u.usage_qty), u.priced_amount
FROM by_unit u WHERE u.priced_amount <> price_usage(u.plan, u.price_version, u.unit, u.usage_qty)
UNION ALL
SELECT b.invoice_id, b.org, b.period, 'billed for the period = billable usage', b.unit, b.billable_quantity, b.billed_quantity
FROM finance_period_billing b WHERE b.billed_quantity <> b.billable_quantity
UNION ALL
SELECT b.invoice_id, b.org, b.period, 'amount billed for the period = price_usage(billed)', b.unit,
       price_usage(b.plan, b.price_version, b.unit, b.billed_quantity), b.billed_amount
FROM finance_period_billing b WHERE b.billed_amount <> price_usage(b.plan, b.price_version, b.unit, b.billed_quantity);

COMMENT ON VIEW finance_invoice_tieout IS 'Invoice tie-out: one row per difference (total vs subtotal, subtotal vs lines, priced quantity vs usage lines, amounts vs price_usage, units billed for a period vs its billable usage now). Empty when every invoice ties out; a billed/billable difference after a close is a correction the next close bills.';

DROP VIEW credits_covered;
DROP INDEX credit_consumptions_period_idx;
ALTER TABLE invoice_lines DROP CONSTRAINT invoice_lines_kind_check;
ALTER TABLE invoice_lines ADD CONSTRAINT invoice_lines_kind_check
    CHECK (kind IN ('base_fee', 'usage', 'included', 'overage_tier', 'adjustment', 'late'));
COMMENT ON COLUMN invoice_lines.kind IS NULL;
