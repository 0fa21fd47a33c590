-- +goose Up
-- Price versions (issue 18). A plan's price (currency, base fee, included units, graduated
-- tiers) is versioned: a change is a new version effective from a period, and the version
-- that prices a period is the plan's latest version (highest number) whose effective_period
-- is on or before it (price_version). A later version effective from an earlier period
-- therefore supersedes a scheduled one from there on. The store (policy.Store) only ever
-- adds versions, effective after the last closed period; an invoice records the version it
-- was priced with (invoices.price_version) and the rows of a version that priced an invoice
-- cannot change (price_version_frozen), so issued invoices keep their prices.
--
-- The tables keep their names, and version 1 effective from 0001-01-01 ("from the start")
-- is the default, so the existing rows become version 1 and SQL that writes a plan's first
-- price by hand (seeds, internal/demo) works unchanged.

ALTER TABLE plan_price_tiers DROP CONSTRAINT plan_price_tiers_plan_unit_fkey;
ALTER TABLE plan_price_units DROP CONSTRAINT plan_price_units_plan_fkey;

ALTER TABLE plan_prices
    ADD COLUMN version          integer     NOT NULL DEFAULT 1 CONSTRAINT plan_prices_version CHECK (version >= 1),
    ADD COLUMN effective_period date        NOT NULL DEFAULT '0001-01-01'
        CONSTRAINT plan_prices_effective_period CHECK (extract(day FROM effective_period) = 1),
    ADD COLUMN created_at       timestamptz NOT NULL DEFAULT now(),
    DROP CONSTRAINT plan_prices_pkey,
    ADD PRIMARY KEY (plan, version);

ALTER TABLE plan_price_units
    ADD COLUMN version integer NOT NULL DEFAULT 1,
    DROP CONSTRAINT plan_price_units_pkey,
    ADD PRIMARY KEY (plan, version, unit),
    ADD FOREIGN KEY (plan, version) REFERENCES plan_prices (plan, version) ON DELETE CASCADE;

ALTER TABLE plan_price_tiers
    ADD COLUMN version integer NOT NULL DEFAULT 1,
    DROP CONSTRAINT plan_price_tiers_pkey,
    ADD PRIMARY KEY (plan, version, unit, from_units),
    ADD FOREIGN KEY (plan, version, unit) REFERENCES plan_price_units (plan, version, unit) ON DELETE CASCADE;

COMMENT ON TABLE plan_prices IS 'Price versions of a plan: its currency (ISO 4217) and base fee in minor units, per version. The version pricing a period is price_version(plan, period).';
COMMENT ON COLUMN plan_prices.version IS 'Version number, 1, 2, ... per plan; versions are only ever added.';
COMMENT ON COLUMN plan_prices.effective_period IS 'First day of the first month the version prices (0001-01-01: from the start); a later version with an earlier or equal effective_period supersedes it from there on.';
COMMENT ON COLUMN plan_price_units.version IS 'The price version (plan_prices.version) the row belongs to.';
COMMENT ON COLUMN plan_price_tiers.version IS 'The price version (plan_prices.version) the row belongs to.';

-- +goose StatementBegin
CREATE FUNCTION price_version(plan text, period date) RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT max(p.version) FROM plan_prices p
    WHERE p.plan = price_version.plan AND p.effective_period <= price_version.period
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION price_version(text, date) IS 'The price version of a plan that prices a period: the highest version effective on or before it; NULL when none is.';

-- Existing invoices were priced with the only version there was, 1: the default fills
-- them in without an UPDATE (which the immutability trigger would refuse), then goes,
-- so that a close must say which version it used.
ALTER TABLE invoices ADD COLUMN price_version integer NOT NULL DEFAULT 1;
ALTER TABLE invoices ALTER COLUMN price_version DROP DEFAULT;
ALTER TABLE invoices ADD CONSTRAINT invoices_price_version_fkey
    FOREIGN KEY (plan, price_version) REFERENCES plan_prices (plan, version);
CREATE INDEX invoices_plan_price_version_idx ON invoices (plan, price_version);

COMMENT ON COLUMN invoices.price_version IS 'The version of the plan''s price (plan_prices.version) the invoice was priced with.';
COMMENT ON COLUMN plans.priority IS 'Waiting priority of the orgs on this plan, 0-100, higher first; what an account gets when neither it nor an ancestor sets one. Written through the admin API (PUT /v1/admin/plans/{id}).';

-- The rows of a price version that priced an invoice are frozen: no row of it may be
-- added, changed or removed (a new version is the way to change a price).
-- +goose StatementBegin
CREATE FUNCTION price_version_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND EXISTS (
        SELECT 1 FROM invoices i WHERE i.plan = OLD.plan AND i.price_version = OLD.version) THEN
        RAISE EXCEPTION 'price version % of plan % priced an issued invoice: % on % refused (add a version instead)',
            OLD.version, OLD.plan, TG_OP, TG_TABLE_NAME USING ERRCODE = 'raise_exception';
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND EXISTS (
        SELECT 1 FROM invoices i WHERE i.plan = NEW.plan AND i.price_version = NEW.version) THEN
        RAISE EXCEPTION 'price version % of plan % priced an issued invoice: % on % refused (add a version instead)',
            NEW.version, NEW.plan, TG_OP, TG_TABLE_NAME USING ERRCODE = 'raise_exception';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER plan_prices_frozen BEFORE INSERT OR UPDATE OR DELETE ON plan_prices
    FOR EACH ROW EXECUTE FUNCTION price_version_frozen();
CREATE TRIGGER plan_price_units_frozen BEFORE INSERT OR UPDATE OR DELETE ON plan_price_units
    FOR EACH ROW EXECUTE FUNCTION price_version_frozen();
CREATE TRIGGER plan_price_tiers_frozen BEFORE INSERT OR UPDATE OR DELETE ON plan_price_tiers
    FOR EACH ROW EXECUTE FUNCTION price_version_frozen();

-- The SQL twin of the pricing prices with one version; the tie-out views join the units
-- and call price_usage with the invoice's version.
DROP VIEW finance_invoice_tieout;
DROP VIEW finance_period_billing;
DROP FUNCTION price_usage(text, text, numeric);

-- +goose StatementBegin
CREATE FUNCTION price_usage(plan text, version integer, unit text, quantity numeric) RETURNS numeric
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(sum(div(q.units * t.price_minor + t.per_units - 1, t.per_units)), 0)
    FROM plan_price_tiers t
    CROSS JOIN LATERAL (SELECT greatest(0, least(price_usage.quantity, coalesce(t.up_to_units, price_usage.quantity)) - t.from_units) AS units) q
    WHERE t.plan = price_usage.plan AND t.version = price_usage.version AND t.unit = price_usage.unit
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION price_usage(text, integer, text, numeric) IS 'Overage amount in minor units of quantity units of a unit under one price version of a plan: each tier rounded up, summed.';

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

-- Every way an invoice can fail to tie out, one row per difference; empty when every
-- invoice ties out. check names the test, expected and actual its two sides.
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

-- +goose Down
-- Fails (changing nothing) while a plan has more than one price version: prices an
-- invoice may have used are not dropped.
DROP VIEW finance_invoice_tieout;
DROP VIEW finance_period_billing;
DROP FUNCTION price_usage(text, integer, text, numeric);

-- +goose StatementBegin
CREATE FUNCTION price_usage(plan text, unit text, quantity numeric) RETURNS numeric
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(sum(div(q.units * t.price_minor + t.per_units - 1, t.per_units)), 0)
    FROM plan_price_tiers t
    CROSS JOIN LATERAL (SELECT greatest(0, least(price_usage.quantity, coalesce(t.up_to_units, price_usage.quantity)) - t.from_units) AS units) q
    WHERE t.plan = price_usage.plan AND t.unit = price_usage.unit
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION price_usage(text, text, numeric) IS 'Overage amount in minor units of quantity units of a plan''s unit: each tier rounded up, summed.';

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
SELECT i.id AS invoice_id, i.org, i.period, i.plan, pu.unit,
       coalesce(bl.quantity, 0)::bigint AS billable_quantity,
       coalesce(bd.quantity, 0)::bigint AS billed_quantity,
       coalesce(bd.amount, 0)::bigint AS billed_amount
FROM invoices i
JOIN plan_price_units pu ON pu.plan = i.plan
LEFT JOIN billable bl ON bl.org = i.org AND bl.period = i.period AND bl.unit = pu.unit
LEFT JOIN billed bd ON bd.org = i.org AND bd.period = i.period AND bd.unit = pu.unit;

COMMENT ON VIEW finance_period_billing IS 'Per closed period, org and billed unit: billable units now (covered events and billed late events, today''s outcomes) against units and amounts billed for the period on its invoice and later ones (late and adjustment lines).';

-- Every way an invoice can fail to tie out, one row per difference; empty when every
-- invoice ties out. check names the test, expected and actual its two sides.
CREATE VIEW finance_invoice_tieout AS
WITH lines AS (
    SELECT invoice_id, sum(amount_minor) AS amount FROM invoice_lines GROUP BY invoice_id
), by_unit AS (
    SELECT i.id AS invoice_id, i.org, i.period, i.plan, pu.unit,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind = 'usage'), 0) AS usage_qty,
           coalesce(sum(l.quantity) FILTER (WHERE l.kind IN ('included', 'overage_tier')), 0) AS priced_qty,
           coalesce(sum(l.amount_minor) FILTER (WHERE l.kind IN ('included', 'overage_tier')), 0) AS priced_amount
    FROM invoices i
    JOIN plan_price_units pu ON pu.plan = i.plan
    LEFT JOIN invoice_lines l ON l.invoice_id = i.id AND l.unit = pu.unit
    GROUP BY i.id, i.org, i.period, i.plan, pu.unit
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
       price_usage(u.plan, u.unit, u.usage_qty), u.priced_amount
FROM by_unit u WHERE u.priced_amount <> price_usage(u.plan, u.unit, u.usage_qty)
UNION ALL
SELECT b.invoice_id, b.org, b.period, 'billed for the period = billable usage', b.unit, b.billable_quantity, b.billed_quantity
FROM finance_period_billing b WHERE b.billed_quantity <> b.billable_quantity
UNION ALL
SELECT b.invoice_id, b.org, b.period, 'amount billed for the period = price_usage(billed)', b.unit,
       price_usage(b.plan, b.unit, b.billed_quantity), b.billed_amount
FROM finance_period_billing b WHERE b.billed_amount <> price_usage(b.plan, b.unit, b.billed_quantity);

COMMENT ON VIEW finance_invoice_tieout IS 'Invoice tie-out: one row per difference (total vs subtotal, subtotal vs lines, priced quantity vs usage lines, amounts vs price_usage, units billed for a period vs its billable usage now). Empty when every invoice ties out; a billed/billable difference after a close is a correction the next close bills.';

DROP TRIGGER plan_price_tiers_frozen ON plan_price_tiers;
DROP TRIGGER plan_price_units_frozen ON plan_price_units;
DROP TRIGGER plan_prices_frozen ON plan_prices;
DROP FUNCTION price_version_frozen();

DROP INDEX invoices_plan_price_version_idx;
ALTER TABLE invoices DROP CONSTRAINT invoices_price_version_fkey;
ALTER TABLE invoices DROP COLUMN price_version;
DROP FUNCTION price_version(text, date);

ALTER TABLE plan_price_tiers DROP CONSTRAINT plan_price_tiers_plan_version_unit_fkey;
ALTER TABLE plan_price_units DROP CONSTRAINT plan_price_units_plan_version_fkey;
ALTER TABLE plan_price_tiers DROP CONSTRAINT plan_price_tiers_pkey;
ALTER TABLE plan_price_units DROP CONSTRAINT plan_price_units_pkey;
ALTER TABLE plan_prices DROP CONSTRAINT plan_prices_pkey;
ALTER TABLE plan_price_tiers DROP COLUMN version, ADD PRIMARY KEY (plan, unit, from_units);
ALTER TABLE plan_price_units DROP COLUMN version, ADD PRIMARY KEY (plan, unit);
ALTER TABLE plan_prices DROP COLUMN version, DROP COLUMN effective_period, DROP COLUMN created_at, ADD PRIMARY KEY (plan);
ALTER TABLE plan_price_units ADD FOREIGN KEY (plan) REFERENCES plan_prices (plan) ON DELETE CASCADE;
ALTER TABLE plan_price_tiers ADD FOREIGN KEY (plan, unit) REFERENCES plan_price_units (plan, unit) ON DELETE CASCADE;
COMMENT ON TABLE plan_prices IS 'What a plan costs per billing period: its currency (ISO 4217) and base fee in minor units.';
COMMENT ON COLUMN plans.priority IS 'Waiting priority of the orgs on this plan, 0-100, higher first; what an account gets when neither it nor an ancestor sets one. Set in SQL (no admin API for plans yet).';
