-- +goose Up
-- Invoices as documents (issue 31): customers' billing details, gapless numbers per issuer,
-- tax, statuses with an audit row per change, credit notes, and the billing events a payment
-- system follows. Every document is sealed as invoices are (00019): written once by the
-- transaction that issues it; the one later change is an invoice's status, and only with
-- its audit row.

-- The customer's (an org's) billing details, written through the admin API. An invoice
-- copies them when it is issued (invoices.buyer): a later change moves no issued document.
CREATE TABLE billing_details (
    org          text PRIMARY KEY CHECK (length(org) BETWEEN 1 AND 64),
    legal_name   text NOT NULL CHECK (length(legal_name) BETWEEN 1 AND 200),
    address      text[] NOT NULL DEFAULT '{}' CHECK (cardinality(address) <= 4),
    city         text NOT NULL DEFAULT '' CHECK (length(city) <= 100),
    postal_code  text NOT NULL DEFAULT '' CHECK (length(postal_code) <= 20),
    region       text NOT NULL DEFAULT '' CHECK (length(region) <= 100),
    country      text NOT NULL CHECK (country ~ '^[A-Z]{2}$'),
    email        text NOT NULL DEFAULT '' CHECK (length(email) <= 254),
    tax_id       text NOT NULL DEFAULT '' CHECK (length(tax_id) <= 50),
    currency     text CHECK (currency ~ '^[A-Z]{3}$'),
    tax_rate_bp  integer CHECK (tax_rate_bp BETWEEN 0 AND 10000),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text NOT NULL
);

COMMENT ON TABLE billing_details IS 'Billing details of each customer (org): who its invoices are addressed to. An invoice copies them when issued (invoices.buyer).';
COMMENT ON COLUMN billing_details.currency IS 'The currency the customer is invoiced in; NULL: its plan''s. A close refuses (for this org alone) a plan priced in another currency.';
COMMENT ON COLUMN billing_details.tax_rate_bp IS 'The customer''s tax rate in basis points (1900 = 19 %); NULL: the rate configured for its country (BILLING_TAX_RATES), else BILLING_TAX_RATE.';

-- One gapless counter per issuer, kind of document and year. A document takes the next
-- value with an UPDATE in the transaction that issues it: the row lock orders issuers of
-- the same sequence, and a rollback (of the transaction, or of one org's savepoint) takes
-- the value back with the document, so no number is ever skipped.
CREATE TABLE document_sequences (
    issuer text    NOT NULL CHECK (issuer ~ '^[A-Z0-9]{1,10}$'),
    kind   text    NOT NULL CHECK (kind IN ('invoice', 'credit_note')),
    year   integer NOT NULL CHECK (year BETWEEN 2000 AND 9999),
    last   bigint  NOT NULL CHECK (last BETWEEN 0 AND 999999999),
    PRIMARY KEY (issuer, kind, year)
);

COMMENT ON TABLE document_sequences IS 'The last number given per issuer (BILLING_NUMBER_PREFIX), kind and year of issue: MG-2026-000123 is the 123rd invoice of 2026, MG-CN-2026-000004 the 4th credit note. Taken in the issuing transaction, which holds the row locked until it commits: no gap.';

-- Invoices: a number, the issuer's and the customer's details as they were, tax, a due
-- date, statuses and reissues.
ALTER TABLE invoices
    ADD COLUMN number      text UNIQUE,
    ADD COLUMN issuer      text,
    ADD COLUMN seller      jsonb,
    ADD COLUMN buyer       jsonb,
    ADD COLUMN tax_rate_bp integer NOT NULL DEFAULT 0 CHECK (tax_rate_bp BETWEEN 0 AND 10000),
    ADD COLUMN tax_minor   bigint  NOT NULL DEFAULT 0,
    ADD COLUMN due_at      timestamptz,
    ADD COLUMN replaces    bigint UNIQUE REFERENCES invoices (id),
    ADD COLUMN reason      text CHECK (length(reason) <= 1000),
    ADD COLUMN issued_by   text,
    DROP CONSTRAINT invoices_status_check,
    ADD CONSTRAINT invoices_status_check CHECK (status IN ('issued', 'paid', 'void', 'uncollectible')),
    ADD CONSTRAINT invoices_total CHECK (total_minor = subtotal_minor + tax_minor),
    ADD CONSTRAINT invoices_numbered CHECK ((number IS NULL) = (issuer IS NULL)),
    ADD CONSTRAINT invoices_reissue CHECK ((replaces IS NULL) = (reason IS NULL)),
    DROP CONSTRAINT invoices_org_period_key;

-- One original invoice per org and period; a reissue replaces one invoice, once.
CREATE UNIQUE INDEX invoices_org_period_key ON invoices (org, period) WHERE replaces IS NULL;

COMMENT ON TABLE invoices IS 'Invoices: one per org and closed period, and the reissues that replace a voided one (replaces). Sealed once issued: triggers refuse DELETE, TRUNCATE and any UPDATE but a status change with its audit row (invoice_status_changes), and lines or late events added by another transaction than the one that issued it.';
COMMENT ON COLUMN invoices.number IS 'The document number, gapless per issuer and year (document_sequences); NULL for invoices issued before migration 00022.';
COMMENT ON COLUMN invoices.seller IS 'The issuer''s details (BILLING_SELLER_*) when the invoice was issued.';
COMMENT ON COLUMN invoices.buyer IS 'The customer''s billing details (billing_details) when the invoice was issued; NULL when it had none.';
COMMENT ON COLUMN invoices.subtotal_minor IS 'Sum of the lines, in minor units of currency.';
COMMENT ON COLUMN invoices.tax_minor IS 'round(subtotal_minor * tax_rate_bp / 10000), halves away from zero; total_minor = subtotal_minor + tax_minor.';
COMMENT ON COLUMN invoices.status IS 'issued, then paid, void or uncollectible (uncollectible may still become paid or void); each change is a row of invoice_status_changes.';
COMMENT ON COLUMN invoices.issued_by IS 'Who issued it: the close (periods.closed_by), or who reissued it; NULL before migration 00022.';
COMMENT ON COLUMN invoices.replaces IS 'A reissue: the voided invoice it replaces (reason: why it was reissued).';

-- Every change of an invoice's status, with who and why: the audit trail, append-only.
CREATE TABLE invoice_status_changes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    invoice_id  bigint      NOT NULL REFERENCES invoices (id),
    from_status text        NOT NULL,
    to_status   text        NOT NULL,
    reason      text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    changed_by  text        NOT NULL,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    xact        xid8        NOT NULL DEFAULT pg_current_xact_id(),
    CONSTRAINT invoice_status_changes_allowed CHECK (
        (from_status = 'issued' AND to_status IN ('paid', 'void', 'uncollectible'))
        OR (from_status = 'uncollectible' AND to_status IN ('paid', 'void')))
);

CREATE INDEX invoice_status_changes_invoice_idx ON invoice_status_changes (invoice_id, id);

COMMENT ON TABLE invoice_status_changes IS 'Each change of an invoice''s status, its reason and who made it (append-only). An invoice''s status changes only together with such a row, written in the same transaction.';

CREATE TRIGGER invoice_status_changes_append_only BEFORE UPDATE OR DELETE ON invoice_status_changes
    FOR EACH ROW EXECUTE FUNCTION append_only('the audit trail of invoice statuses');
CREATE TRIGGER invoice_status_changes_no_truncate BEFORE TRUNCATE ON invoice_status_changes
    FOR EACH STATEMENT EXECUTE FUNCTION append_only('the audit trail of invoice statuses');

-- Every invoice is a document from its insert on (the close writes them issued): sealed
-- whatever its status. The one UPDATE allowed changes the status alone, along a row of
-- invoice_status_changes written by the same transaction.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION invoice_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'issued invoices are immutable: TRUNCATE on % refused', TG_TABLE_NAME
            USING ERRCODE = 'raise_exception';
    END IF;
    IF TG_TABLE_NAME = 'invoices' THEN
        IF TG_OP = 'UPDATE'
            AND to_jsonb(NEW) - 'status' = to_jsonb(OLD) - 'status'
            AND NEW.status IS DISTINCT FROM OLD.status
            AND EXISTS (SELECT 1 FROM invoice_status_changes c
                        WHERE c.invoice_id = OLD.id AND c.from_status = OLD.status AND c.to_status = NEW.status
                          AND c.xact = pg_current_xact_id()) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'invoice % is issued and immutable: % refused (only its status changes, with a row of invoice_status_changes)', OLD.id, TG_OP
            USING ERRCODE = 'raise_exception';
    END IF;
    RAISE EXCEPTION 'invoice % is issued and immutable: % on its line % refused', OLD.invoice_id, TG_OP, OLD.line_no
        USING ERRCODE = 'raise_exception';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION invoice_stamp_issue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.issued_xact := pg_current_xact_id();
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- Stamp inserts only: an UPDATE (a status change) keeps the issuing transaction.
DROP TRIGGER invoices_stamp_issue ON invoices;
CREATE TRIGGER invoices_stamp_issue BEFORE INSERT ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoice_stamp_issue();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION invoice_sealed_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    xact xid8;
BEGIN
    SELECT i.issued_xact INTO xact FROM invoices i WHERE i.id = NEW.invoice_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invoice % does not exist: % into % refused', NEW.invoice_id, TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF xact IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'invoice % is issued and sealed: % into % refused (only the transaction that issued it adds rows)',
            NEW.invoice_id, TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'raise_exception';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- Credit notes: a document that credits an invoice, numbered in a sequence of its own. A
-- void credits the whole invoice (its lines, tax and total, once per invoice).
CREATE TABLE credit_notes (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    number         text        NOT NULL UNIQUE,
    issuer         text        NOT NULL,
    org            text        NOT NULL,
    invoice_id     bigint      NOT NULL REFERENCES invoices (id),
    kind           text        NOT NULL CHECK (kind IN ('void')),
    reason         text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    currency       text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    subtotal_minor bigint      NOT NULL,
    tax_rate_bp    integer     NOT NULL CHECK (tax_rate_bp BETWEEN 0 AND 10000),
    tax_minor      bigint      NOT NULL,
    total_minor    bigint      NOT NULL,
    issued_at      timestamptz NOT NULL DEFAULT now(),
    issued_by      text        NOT NULL,
    seller         jsonb       NOT NULL,
    buyer          jsonb,
    issued_xact    xid8,
    CONSTRAINT credit_notes_total CHECK (total_minor = subtotal_minor + tax_minor)
);

CREATE UNIQUE INDEX credit_notes_void_once ON credit_notes (invoice_id) WHERE kind = 'void';
CREATE INDEX credit_notes_org_idx ON credit_notes (org, issued_at);

COMMENT ON TABLE credit_notes IS 'Credit notes: documents crediting an invoice (amounts positive: what is credited), numbered per issuer and year in their own sequence. kind void: the whole invoice, issued when it is voided. Sealed as invoices are.';

CREATE TABLE credit_note_lines (
    credit_note_id   bigint  NOT NULL REFERENCES credit_notes (id),
    line_no          integer NOT NULL CHECK (line_no >= 1),
    kind             text    NOT NULL,
    account_path     text    NOT NULL,
    unit             text,
    quantity         bigint  NOT NULL,
    unit_price_minor bigint  NOT NULL,
    per_units        bigint  NOT NULL CHECK (per_units > 0),
    amount_minor     bigint  NOT NULL,
    for_period       date,
    PRIMARY KEY (credit_note_id, line_no)
);

COMMENT ON TABLE credit_note_lines IS 'Lines of a credit note: for a void, the invoice''s lines as they were. Added only by the transaction that issued the note.';

-- +goose StatementBegin
CREATE FUNCTION credit_note_stamp_issue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.issued_xact := pg_current_xact_id();
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER credit_notes_stamp_issue BEFORE INSERT ON credit_notes
    FOR EACH ROW EXECUTE FUNCTION credit_note_stamp_issue();

-- +goose StatementBegin
CREATE FUNCTION credit_note_sealed_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    xact xid8;
BEGIN
    SELECT n.issued_xact INTO xact FROM credit_notes n WHERE n.id = NEW.credit_note_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'credit note % does not exist: % into % refused', NEW.credit_note_id, TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF xact IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'credit note % is issued and sealed: % into % refused (only the transaction that issued it adds rows)',
            NEW.credit_note_id, TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'raise_exception';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER credit_note_lines_sealed BEFORE INSERT ON credit_note_lines
    FOR EACH ROW EXECUTE FUNCTION credit_note_sealed_insert();
CREATE TRIGGER credit_notes_append_only BEFORE UPDATE OR DELETE ON credit_notes
    FOR EACH ROW EXECUTE FUNCTION append_only('an issued credit note is a sealed document');
CREATE TRIGGER credit_notes_no_truncate BEFORE TRUNCATE ON credit_notes
    FOR EACH STATEMENT EXECUTE FUNCTION append_only('an issued credit note is a sealed document');
CREATE TRIGGER credit_note_lines_append_only BEFORE UPDATE OR DELETE ON credit_note_lines
    FOR EACH ROW EXECUTE FUNCTION append_only('an issued credit note is a sealed document');
CREATE TRIGGER credit_note_lines_no_truncate BEFORE TRUNCATE ON credit_note_lines
    FOR EACH STATEMENT EXECUTE FUNCTION append_only('an issued credit note is a sealed document');

-- Billing events: a CloudEvent per document issued and per status change, written in the
-- transaction that made it, so each exists exactly when what it reports does (and its id,
-- the primary key, makes it fire once).
CREATE TABLE billing_events (
    id          text        PRIMARY KEY,
    type        text        NOT NULL CHECK (type IN ('invoice.issued.v1', 'invoice.status_changed.v1', 'credit_note.issued.v1')),
    org         text        NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    payload     jsonb       NOT NULL
);

CREATE INDEX billing_events_org_idx ON billing_events (org, occurred_at);

COMMENT ON TABLE billing_events IS 'io.metergate.invoice.issued.v1, invoice.status_changed.v1 and credit_note.issued.v1 CloudEvents (payload), one per document or status change, written in its transaction (append-only).';

CREATE TRIGGER billing_events_append_only BEFORE UPDATE OR DELETE ON billing_events
    FOR EACH ROW EXECUTE FUNCTION append_only('a billing event fires once');
CREATE TRIGGER billing_events_no_truncate BEFORE TRUNCATE ON billing_events
    FOR EACH STATEMENT EXECUTE FUNCTION append_only('a billing event fires once');

-- Late events are billed by a live invoice (not void): the late events a voided invoice
-- billed are billed again by the next invoice of the org (or the reissue).
ALTER TABLE invoice_late_events DROP CONSTRAINT invoice_late_events_pkey,
    ADD PRIMARY KEY (event_id, billing_period, invoice_id);

CREATE VIEW billed_late_events AS
SELECT l.event_id, l.billing_period, l.invoice_id
FROM invoice_late_events l
JOIN invoices i ON i.id = l.invoice_id
WHERE i.status <> 'void';

COMMENT ON VIEW billed_late_events IS 'Late events and the live (not void) invoice that billed them: at most one per event.';

-- An org's period is held while its invoice for it is void and not reissued: nothing of
-- the period is billed (its late events wait, no correction is made) until the reissue.
CREATE VIEW held_periods AS
SELECT DISTINCT i.org, i.period
FROM invoices i
WHERE i.status = 'void'
  AND NOT EXISTS (SELECT 1 FROM invoices r WHERE r.org = i.org AND r.period = i.period AND r.status <> 'void');

COMMENT ON VIEW held_periods IS 'Orgs and closed periods whose invoice is void and not reissued: their late events and corrections wait for the reissue.';

DROP VIEW finance_invoice_tieout;
DROP VIEW finance_period_billing;
DROP VIEW finance_late_events;

CREATE VIEW finance_late_events AS
SELECT b.event_id, b.billing_period, b.org, b.account, b.account_path, b.event_time, b.ingest_time,
       p.closed_at, b.late AS flagged_late, b.refunded,
       b.billable_requests, b.billable_tokens, b.billable_credits, b.billable_cost_micros,
       l.invoice_id AS billed_on,
       h.org IS NOT NULL AS held
FROM finance_billable_events b
JOIN periods p ON p.period = b.billing_period
LEFT JOIN billed_late_events l ON l.event_id = b.event_id AND l.billing_period = b.billing_period
LEFT JOIN held_periods h ON h.org = b.org AND h.period = b.billing_period
WHERE b.late OR b.ingest_time > p.closed_at;

COMMENT ON VIEW finance_late_events IS 'Events of closed periods not covered by that period''s invoice (flagged late, or ingested after closed_at); billed_on = the live invoice that billed them as late lines, NULL until then; held: the org''s invoice of the period is void and not reissued, so they wait.';

-- Per live invoice: what is billable for its period now against what live invoices billed
-- for it (a void invoice and its credit note cancel each other, so neither counts), less
-- what amendment credit notes (kind amendment, migration 00024) credited on them. Its sums
-- are numeric: an org's month grown past bigint (late data) is that org's problem, reported
-- by the tie-out and refused by its close, never an error of the query for every org.
CREATE VIEW finance_period_billing AS
WITH billable AS (
    SELECT b.org, b.billing_period AS period, u.unit,
           sum(CASE u.unit WHEN 'requests' THEN b.billable_requests WHEN 'tokens' THEN b.billable_tokens
                           WHEN 'credits' THEN b.billable_credits ELSE b.billable_cost_micros END) AS quantity
    FROM finance_billable_events b
    JOIN periods p ON p.period = b.billing_period
    LEFT JOIN billed_late_events l ON l.event_id = b.event_id AND l.billing_period = b.billing_period
    CROSS JOIN (VALUES ('requests'), ('tokens'), ('credits'), ('cost_micros')) AS u (unit)
    WHERE (NOT b.late AND b.ingest_time <= p.closed_at) OR l.invoice_id IS NOT NULL
    GROUP BY b.org, b.billing_period, u.unit
), covered AS (
    SELECT c.org, c.billing_period AS period, c.unit, sum(c.covered) AS quantity
    FROM credits_covered c
    JOIN periods p ON p.period = c.billing_period
    LEFT JOIN billed_late_events l ON l.event_id = c.event_id AND l.billing_period = c.billing_period
    WHERE (NOT c.late AND c.ingest_time <= p.closed_at) OR l.invoice_id IS NOT NULL
    GROUP BY c.org, c.billing_period, c.unit
), lines AS (
    SELECT i.org, coalesce(l.for_period, i.period) AS period, l.unit, l.kind, l.quantity, l.amount_minor
    FROM invoices i
    JOIN invoice_lines l ON l.invoice_id = i.id
    WHERE l.unit IS NOT NULL AND i.status <> 'void'
    UNION ALL
    SELECT n.org, l.for_period, l.unit, l.kind, -l.quantity, -l.amount_minor
    FROM credit_notes n
    JOIN invoices i ON i.id = n.invoice_id
    JOIN credit_note_lines l ON l.credit_note_id = n.id
    WHERE n.kind = 'amendment' AND i.status <> 'void' AND l.unit IS NOT NULL
), billed AS (
    SELECT org, period, unit,
           coalesce(sum(quantity) FILTER (WHERE kind IN ('usage', 'late', 'adjustment')), 0) AS quantity,
           coalesce(sum(amount_minor) FILTER (WHERE kind IN ('included', 'overage_tier', 'late', 'adjustment')), 0) AS amount,
           coalesce(sum(quantity) FILTER (WHERE kind = 'credits_applied'), 0) AS covered
    FROM lines
    GROUP BY org, period, unit
)
SELECT i.id AS invoice_id, i.org, i.period, i.plan, i.price_version, pu.unit,
       coalesce(bl.quantity, 0) AS billable_quantity,
       coalesce(bd.quantity, 0) AS billed_quantity,
       coalesce(bd.amount, 0) AS billed_amount,
       coalesce(cv.quantity, 0) AS covered_quantity,
       coalesce(bd.covered, 0) AS billed_covered
FROM invoices i
JOIN plan_price_units pu ON pu.plan = i.plan AND pu.version = i.price_version
LEFT JOIN billable bl ON bl.org = i.org AND bl.period = i.period AND bl.unit = pu.unit
LEFT JOIN covered cv ON cv.org = i.org AND cv.period = i.period AND cv.unit = pu.unit
LEFT JOIN billed bd ON bd.org = i.org AND bd.period = i.period AND bd.unit = pu.unit
WHERE i.status <> 'void';

COMMENT ON VIEW finance_period_billing IS 'Per live (not void) invoice''s period, org and billed unit of its price version: billable units now (covered events and late events billed by a live invoice, today''s outcomes and amendments) and the units of them the org''s credits covered (covered_quantity), against units, amounts and credits applied billed for the period by live invoices (its own usage lines, later late, adjustment and credits_applied lines), less what amendment credit notes on them credited.';

-- Rounding of tax: half away from zero, exactly.
-- +goose StatementBegin
CREATE FUNCTION tax_minor(subtotal bigint, rate_bp integer) RETURNS numeric LANGUAGE sql IMMUTABLE AS $$
    SELECT sign(subtotal) * div(abs(subtotal)::numeric * rate_bp + 5000, 10000)
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION tax_minor(bigint, integer) IS 'The tax on a subtotal at rate_bp basis points: subtotal * rate_bp / 10000 rounded half away from zero (internal/invoice.Tax).';

CREATE VIEW finance_invoice_tieout AS
WITH lines AS (
    SELECT invoice_id, sum(amount_minor) AS amount FROM invoice_lines GROUP BY invoice_id
), note_lines AS (
    SELECT credit_note_id, sum(amount_minor) AS amount FROM credit_note_lines GROUP BY credit_note_id
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
SELECT i.id AS invoice_id, i.org, i.period, 'total = subtotal + tax' AS "check", NULL::text AS unit,
       i.subtotal_minor::numeric + i.tax_minor AS expected, i.total_minor::numeric AS actual
FROM invoices i WHERE i.total_minor <> i.subtotal_minor + i.tax_minor
UNION ALL
SELECT i.id, i.org, i.period, 'tax = tax_minor(subtotal, rate)', NULL, tax_minor(i.subtotal_minor, i.tax_rate_bp), i.tax_minor
FROM invoices i WHERE i.tax_minor <> tax_minor(i.subtotal_minor, i.tax_rate_bp)
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
FROM finance_period_billing b WHERE b.billed_covered <> b.covered_quantity
UNION ALL
SELECT n.invoice_id, n.org, i.period, 'credit note ' || n.number || ': subtotal = sum of lines', NULL, coalesce(nl.amount, 0), n.subtotal_minor
FROM credit_notes n JOIN invoices i ON i.id = n.invoice_id LEFT JOIN note_lines nl ON nl.credit_note_id = n.id
WHERE n.subtotal_minor <> coalesce(nl.amount, 0)
UNION ALL
SELECT n.invoice_id, n.org, i.period, 'credit note ' || n.number || ': with the invoice''s other credit notes, credits its total', NULL,
       i.total_minor, c.total
FROM credit_notes n
JOIN invoices i ON i.id = n.invoice_id
CROSS JOIN LATERAL (SELECT sum(o.total_minor) AS total, sum(o.tax_minor) AS tax FROM credit_notes o WHERE o.invoice_id = n.invoice_id) c
WHERE n.kind = 'void' AND (c.total <> i.total_minor OR c.tax <> i.tax_minor)
UNION ALL
SELECT i.id, i.org, i.period, 'a void invoice has its credit note', NULL, 1, 0
FROM invoices i WHERE i.status = 'void' AND NOT EXISTS (SELECT 1 FROM credit_notes n WHERE n.invoice_id = i.id AND n.kind = 'void');

COMMENT ON VIEW finance_invoice_tieout IS 'Invoice tie-out: one row per difference (per invoice: total vs subtotal + tax, tax vs its rounding, subtotal vs lines, credits applied + included + overage quantity vs usage lines, amounts vs price_usage; per live invoice''s period: units, amounts and credits applied billed for it vs its billable and covered usage now; per credit note: subtotal vs lines, a void''s total vs its invoice''s; a void invoice without its credit note). Empty when every document ties out; a billed/billable or applied/covered difference after a close is a correction the next close bills.';

-- +goose Down
DROP VIEW finance_invoice_tieout;
DROP VIEW finance_period_billing;
DROP VIEW finance_late_events;
DROP VIEW held_periods;
DROP VIEW billed_late_events;
DROP FUNCTION tax_minor(bigint, integer);
DROP TABLE billing_events;
DROP TABLE credit_note_lines;
DROP TABLE credit_notes;
DROP FUNCTION credit_note_sealed_insert();
DROP FUNCTION credit_note_stamp_issue();
DROP TABLE invoice_status_changes;
DROP INDEX invoices_org_period_key;
ALTER TABLE invoices
    DROP CONSTRAINT invoices_total,
    DROP CONSTRAINT invoices_numbered,
    DROP CONSTRAINT invoices_reissue,
    DROP CONSTRAINT invoices_status_check,
    ADD CONSTRAINT invoices_status_check CHECK (status = 'issued'),
    ADD CONSTRAINT invoices_org_period_key UNIQUE (org, period),
    DROP COLUMN issued_by,
    DROP COLUMN reason,
    DROP COLUMN replaces,
    DROP COLUMN due_at,
    DROP COLUMN tax_minor,
    DROP COLUMN tax_rate_bp,
    DROP COLUMN buyer,
    DROP COLUMN seller,
    DROP COLUMN issuer,
    DROP COLUMN number;
DROP TABLE document_sequences;
DROP TABLE billing_details;

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

CREATE VIEW finance_invoice_tieout AS
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION invoice_stamp_issue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'issued' THEN
        NEW.issued_xact := pg_current_xact_id();
    ELSE
        NEW.issued_xact := NULL;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

DROP TRIGGER invoices_stamp_issue ON invoices;
CREATE TRIGGER invoices_stamp_issue BEFORE INSERT OR UPDATE ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoice_stamp_issue();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION invoice_sealed_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    issued_status text;
    xact          xid8;
BEGIN
    SELECT i.status, i.issued_xact INTO issued_status, xact FROM invoices i WHERE i.id = NEW.invoice_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invoice % does not exist: % into % refused', NEW.invoice_id, TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF issued_status = 'issued' AND xact IS DISTINCT FROM pg_current_xact_id() THEN
        RAISE EXCEPTION 'invoice % is issued and sealed: % into % refused (only the transaction that issued it adds rows)',
            NEW.invoice_id, TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'raise_exception';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION invoice_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
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

ALTER TABLE invoice_late_events DROP CONSTRAINT invoice_late_events_pkey,
    ADD PRIMARY KEY (event_id, billing_period);
