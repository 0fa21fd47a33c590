-- +goose Up
-- Prices, period close and invoices (internal/invoice), and the finance views (docs/finance.md).
-- Money is integer minor units (cents) of the plan's currency, never floats.
--
-- Rounding rule, the same in invoice.TierAmount and price_usage below: each graduated tier's
-- amount is ceil(units_in_tier * price_minor / per_units), computed exactly (no
-- intermediate rounding), and an invoice's total is the plain sum of its lines.

-- A plan's price: one currency and a base fee per period.
CREATE TABLE plan_prices (
    plan           text    PRIMARY KEY REFERENCES plans (id) ON DELETE CASCADE,
    currency       char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    base_fee_minor bigint  NOT NULL DEFAULT 0 CHECK (base_fee_minor >= 0)
);

COMMENT ON TABLE plan_prices IS 'What a plan costs per billing period: its currency (ISO 4217) and base fee in minor units.';

-- The units a plan bills, and how many of each the base fee includes.
CREATE TABLE plan_price_units (
    plan           text   NOT NULL REFERENCES plan_prices (plan) ON DELETE CASCADE,
    unit           text   NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    included_units bigint NOT NULL DEFAULT 0 CHECK (included_units >= 0),
    PRIMARY KEY (plan, unit)
);

COMMENT ON TABLE plan_price_units IS 'Units a plan bills and the quantity of each included in the base fee. A unit without a row here is not billed.';

-- Graduated tiers over a period's total units of the org: units in [from_units, up_to_units)
-- cost price_minor per per_units. Tiers of a unit are contiguous from included_units to
-- infinity (the last tier's up_to_units is NULL); a unit with no tier bills nothing beyond
-- what is included (free: its quota keeps it there). internal/invoice validates the contiguity.
CREATE TABLE plan_price_tiers (
    plan        text   NOT NULL,
    unit        text   NOT NULL,
    from_units  bigint NOT NULL CHECK (from_units >= 0),
    up_to_units bigint CHECK (up_to_units > from_units),
    price_minor bigint NOT NULL CHECK (price_minor >= 0),
    per_units   bigint NOT NULL DEFAULT 1 CHECK (per_units > 0),
    PRIMARY KEY (plan, unit, from_units),
    FOREIGN KEY (plan, unit) REFERENCES plan_price_units (plan, unit) ON DELETE CASCADE
);

COMMENT ON TABLE plan_price_tiers IS 'Graduated overage tiers: units of the period in [from_units, up_to_units) (NULL = no end) cost price_minor per per_units, rounded up per tier.';

INSERT INTO plan_prices (plan, currency, base_fee_minor) VALUES
    ('free',       'EUR',     0),
    ('pro',        'EUR',  4900),
    ('enterprise', 'EUR', 99000);
INSERT INTO plan_price_units (plan, unit, included_units) VALUES
    ('free',       'requests',         50000),
    ('pro',        'requests',       5000000),
    ('pro',        'tokens',        10000000),
    ('enterprise', 'requests',     100000000),
    ('enterprise', 'tokens',      1000000000);
INSERT INTO plan_price_tiers (plan, unit, from_units, up_to_units, price_minor, per_units) VALUES
    ('pro',        'requests',    5000000,   20000000, 50, 100000),
    ('pro',        'requests',   20000000,       NULL, 30, 100000),
    ('pro',        'tokens',     10000000,  100000000,  2,   1000),
    ('pro',        'tokens',    100000000,       NULL,  1,   1000),
    ('enterprise', 'requests',  100000000,       NULL, 20, 100000),
    ('enterprise', 'tokens',   1000000000,       NULL,  1,   2000);

-- The price of quantity units of unit on plan beyond what is included: the SQL twin of
-- invoice.UnitPrice.Lines, used by the tie-out view to check every invoice independently.
CREATE FUNCTION price_usage(plan text, unit text, quantity numeric) RETURNS numeric
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(sum(div(q.units * t.price_minor + t.per_units - 1, t.per_units)), 0)
    FROM plan_price_tiers t
    CROSS JOIN LATERAL (SELECT greatest(0, least(price_usage.quantity, coalesce(t.up_to_units, price_usage.quantity)) - t.from_units) AS units) q
    WHERE t.plan = price_usage.plan AND t.unit = price_usage.unit
$$;

COMMENT ON FUNCTION price_usage(text, text, numeric) IS 'Overage amount in minor units of quantity units of a plan''s unit: each tier rounded up, summed.';

-- A closed period is frozen: its invoices are issued, and events for it that arrive later
-- are billed on a later invoice (late lines).
CREATE TABLE periods (
    period    date        PRIMARY KEY CHECK (extract(day FROM period) = 1),
    closed_at timestamptz NOT NULL,
    closed_by text        NOT NULL
);

COMMENT ON TABLE periods IS 'Closed billing periods (first day of the UTC month). A row here means the month is invoiced and frozen.';
COMMENT ON COLUMN periods.closed_at IS 'When the close ran: events of the period ingested after it are late.';

CREATE TABLE invoices (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    org            text        NOT NULL,
    period         date        NOT NULL REFERENCES periods (period),
    plan           text        NOT NULL,
    currency       char(3)     NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    subtotal_minor bigint      NOT NULL,
    total_minor    bigint      NOT NULL,
    issued_at      timestamptz NOT NULL,
    status         text        NOT NULL DEFAULT 'issued' CHECK (status IN ('issued')),
    CONSTRAINT invoices_org_period_key UNIQUE (org, period)
);

COMMENT ON TABLE invoices IS 'One invoice per org and closed period; immutable once issued (a trigger refuses UPDATE, DELETE and TRUNCATE).';
COMMENT ON COLUMN invoices.plan IS 'The org''s plan when the period was closed: the prices the invoice used.';
COMMENT ON COLUMN invoices.subtotal_minor IS 'Sum of the lines, in minor units of currency. No tax is computed: total_minor = subtotal_minor.';

-- Kinds: base_fee (the plan's fee); usage (what an account path used of a unit: the
-- breakdown of the org's quantity, amount 0); included (the org's units covered by the
-- base fee, amount 0); overage_tier (the org's units in one graduated tier); late (units of
-- a closed period that arrived after its close, priced at the margin of that period);
-- adjustment (a manual correction).
CREATE TABLE invoice_lines (
    invoice_id       bigint  NOT NULL REFERENCES invoices (id),
    line_no          integer NOT NULL CHECK (line_no >= 1),
    kind             text    NOT NULL CHECK (kind IN ('base_fee', 'usage', 'included', 'overage_tier', 'adjustment', 'late')),
    account_path     text    NOT NULL,
    unit             text,
    quantity         bigint  NOT NULL DEFAULT 0,
    unit_price_minor bigint  NOT NULL DEFAULT 0,
    per_units        bigint  NOT NULL DEFAULT 1 CHECK (per_units > 0),
    amount_minor     bigint  NOT NULL,
    for_period       date,
    PRIMARY KEY (invoice_id, line_no)
);

COMMENT ON TABLE invoice_lines IS 'Lines of an invoice; immutable once the invoice is issued.';
COMMENT ON COLUMN invoice_lines.account_path IS 'Path of the account, org first, joined by "/" (the org alone for org-level lines).';
COMMENT ON COLUMN invoice_lines.amount_minor IS 'ceil(quantity * unit_price_minor / per_units) for a tier; minor units of the invoice currency.';
COMMENT ON COLUMN invoice_lines.for_period IS 'For late lines: the closed period the late units belong to.';

-- Late events billed, so that a late event is billed once.
CREATE TABLE invoice_late_events (
    event_id       text   NOT NULL,
    billing_period date   NOT NULL,
    invoice_id     bigint NOT NULL REFERENCES invoices (id),
    PRIMARY KEY (event_id, billing_period)
);

COMMENT ON TABLE invoice_late_events IS 'Late events (of a closed period) and the invoice that billed them.';

-- +goose StatementBegin
CREATE FUNCTION invoice_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    inv bigint;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'issued invoices are immutable: TRUNCATE on % refused', TG_TABLE_NAME
            USING ERRCODE = 'raise_exception';
    END IF;
    IF TG_TABLE_NAME = 'invoices' THEN
        IF OLD.status = 'issued' THEN
            RAISE EXCEPTION 'invoice % is issued and immutable: % refused', OLD.id, TG_OP
                USING ERRCODE = 'raise_exception';
        END IF;
    ELSE
        inv := OLD.invoice_id;
        IF EXISTS (SELECT 1 FROM invoices i WHERE i.id = inv AND i.status = 'issued') THEN
            RAISE EXCEPTION 'invoice % is issued and immutable: % on its line % refused', inv, TG_OP, OLD.line_no
                USING ERRCODE = 'raise_exception';
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER invoices_immutable BEFORE UPDATE OR DELETE ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoice_immutable();
CREATE TRIGGER invoices_no_truncate BEFORE TRUNCATE ON invoices
    FOR EACH STATEMENT EXECUTE FUNCTION invoice_immutable();
CREATE TRIGGER invoice_lines_immutable BEFORE UPDATE OR DELETE ON invoice_lines
    FOR EACH ROW EXECUTE FUNCTION invoice_immutable();
CREATE TRIGGER invoice_lines_no_truncate BEFORE TRUNCATE ON invoice_lines
    FOR EACH STATEMENT EXECUTE FUNCTION invoice_immutable();

-- Finance views (docs/finance.md).

-- One row per admitted request with what it bills: a request whose outcome was a 5xx is
-- refunded (its units are kept in the row, flagged, and count 0 in billable_*); tokens are
-- settled to the actual tokens when the outcome reported them.
CREATE VIEW finance_billable_events AS
SELECT e.event_id, e.billing_period, e.event_time, e.ingest_time, e.org, e.account, e.path,
       array_to_string(e.path, '/') AS account_path, e.plan, e.late,
       o.status AS outcome_status,
       coalesce(o.status >= 500, false) AS refunded,
       e.requests, e.tokens, e.credits, e.cost_micros,
       CASE WHEN o.status >= 500 THEN 0 ELSE e.requests END AS billable_requests,
       CASE WHEN o.status >= 500 THEN 0 ELSE coalesce(o.tokens, e.tokens) END AS billable_tokens,
       CASE WHEN o.status >= 500 THEN 0 ELSE coalesce(o.credits, e.credits) END AS billable_credits,
       CASE WHEN o.status >= 500 THEN 0 ELSE coalesce(o.cost_micros, e.cost_micros) END AS billable_cost_micros
FROM usage_events e
LEFT JOIN usage_outcomes o ON o.event_id = e.event_id;

COMMENT ON VIEW finance_billable_events IS 'Each admitted request and what it bills: refunded (outcome 5xx) requests bill 0; tokens, credits and cost are settled to the outcome''s actual units when reported.';

CREATE VIEW finance_usage_by_account AS
SELECT billing_period, org, account, account_path, refunded,
       count(*) AS events,
       sum(requests) AS requests, sum(tokens) AS tokens, sum(credits) AS credits, sum(cost_micros) AS cost_micros,
       sum(billable_requests) AS billable_requests, sum(billable_tokens) AS billable_tokens,
       sum(billable_credits) AS billable_credits, sum(billable_cost_micros) AS billable_cost_micros
FROM finance_billable_events
GROUP BY billing_period, org, account, account_path, refunded;

COMMENT ON VIEW finance_usage_by_account IS 'Monthly usage per account (and path), split by refunded (outcome 5xx): admitted units and billable units.';

CREATE VIEW finance_usage_by_org AS
SELECT billing_period, org, refunded,
       count(*) AS events,
       sum(requests) AS requests, sum(tokens) AS tokens, sum(credits) AS credits, sum(cost_micros) AS cost_micros,
       sum(billable_requests) AS billable_requests, sum(billable_tokens) AS billable_tokens,
       sum(billable_credits) AS billable_credits, sum(billable_cost_micros) AS billable_cost_micros
FROM finance_billable_events
GROUP BY billing_period, org, refunded;

COMMENT ON VIEW finance_usage_by_org IS 'Monthly usage per org (the invoiced customer), split by refunded (outcome 5xx): admitted units and billable units.';

-- Events of closed periods that the period's invoice did not cover: flagged late by the
-- meter, or ingested after the close. billed_on is the invoice that billed them (NULL: not
-- yet, they go on the org's next invoice).
CREATE VIEW finance_late_events AS
SELECT b.event_id, b.billing_period, b.org, b.account, b.account_path, b.event_time, b.ingest_time,
       p.closed_at, b.late AS flagged_late, b.refunded,
       b.billable_requests, b.billable_tokens, b.billable_credits, b.billable_cost_micros,
       l.invoice_id AS billed_on
FROM finance_billable_events b
JOIN periods p ON p.period = b.billing_period
LEFT JOIN invoice_late_events l ON l.event_id = b.event_id AND l.billing_period = b.billing_period
WHERE b.late OR b.ingest_time > p.closed_at;

COMMENT ON VIEW finance_late_events IS 'Events of closed periods not covered by that period''s invoice (flagged late, or ingested after closed_at); billed_on = the invoice that billed them as late lines, NULL until then.';

-- What each closed period's invoice and the later invoices billed for it, against what the
-- billing log says is billable for it now, per org, period and unit the invoice's plan bills.
-- billable_quantity: the period's events covered by its invoice (not late, ingested by
-- closed_at) and its late events already billed, with today's outcomes (a 5xx reported after
-- the close is refunded here). billed_quantity: usage lines of the period's invoice plus late
-- and adjustment lines for the period on later invoices; billed_amount: their amounts
-- (included, overage tiers, late, adjustment). A difference in quantity is a correction the
-- next close bills as an adjustment line.
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

CREATE VIEW finance_dead_letters AS
SELECT id, topic, "partition", "offset", received_at, error, octet_length(value) AS bytes,
       encode(substring(value FROM 1 FOR 200), 'escape') AS value_head
FROM dead_letters;

COMMENT ON VIEW finance_dead_letters IS 'Kafka messages the meter could not parse (never billed): position, error, size and the first 200 bytes.';

-- +goose Down
DROP VIEW finance_dead_letters;
DROP VIEW finance_invoice_tieout;
DROP VIEW finance_period_billing;
DROP VIEW finance_late_events;
DROP VIEW finance_usage_by_org;
DROP VIEW finance_usage_by_account;
DROP VIEW finance_billable_events;
DROP TABLE invoice_late_events;
DROP TABLE invoice_lines;
DROP TABLE invoices;
DROP FUNCTION invoice_immutable();
DROP TABLE periods;
DROP FUNCTION price_usage(text, text, numeric);
DROP TABLE plan_price_tiers;
DROP TABLE plan_price_units;
DROP TABLE plan_prices;
