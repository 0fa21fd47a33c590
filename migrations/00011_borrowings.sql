-- +goose Up
-- Borrowing (issue 17): a token-bucket limit with a ceiling lets an account take spare rate
-- capacity of its parent beyond its own guaranteed rate. The admission script records, per
-- admitted request, which accounts of its path borrowed how many units; the meter writes
-- one row per account and unit here, in the transaction of the request's usage_events row,
-- with the same dedupe (ON CONFLICT DO NOTHING on the key), so a redelivered event never
-- doubles a borrowing.
--
-- Borrowed units are rate capacity taken at admission. They are not quota: reconcile's
-- refunds (5xx, voids) and settlements (actual tokens) correct quota counters and billable
-- units, and change no borrowing. The chargeback view leaves out voided requests only (no
-- caller was told 200: the request counts for nothing), as billable_events defines them.
-- (00010 is another change's number.)
CREATE TABLE usage_borrowings (
    event_id       text        NOT NULL,
    billing_period date        NOT NULL,
    charged_period date        NOT NULL,
    event_time     timestamptz NOT NULL,
    ingest_time    timestamptz NOT NULL DEFAULT now(),
    org            text        NOT NULL,
    account        text        NOT NULL,
    lender         text        NOT NULL,
    unit           text        NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    units          bigint      NOT NULL CHECK (units > 0),
    PRIMARY KEY (event_id, account, unit),
    CONSTRAINT usage_borrowings_billing_period CHECK (billing_period = date_trunc('month', event_time AT TIME ZONE 'UTC')::date),
    CONSTRAINT usage_borrowings_charged_period CHECK (extract(day FROM charged_period) = 1),
    CONSTRAINT usage_borrowings_not_the_org CHECK (account <> org AND account <> lender)
);

-- Chargeback reads a month at a time.
CREATE INDEX usage_borrowings_period_idx ON usage_borrowings (charged_period, org);

COMMENT ON TABLE usage_borrowings IS 'Rate capacity an admitted request borrowed (data.borrowed of io.metergate.usage.admitted.v1): one row per borrowing account and unit, written by the meter with the request''s usage_events row. Rate capacity at admission: refunds and settlements do not change it.';
COMMENT ON COLUMN usage_borrowings.event_id IS 'The admission''s event id (usage_events.event_id).';
COMMENT ON COLUMN usage_borrowings.billing_period IS 'usage_events.billing_period of the admission (the month of event_time), to find its row in its partition.';
COMMENT ON COLUMN usage_borrowings.charged_period IS 'First day of the month admit charged (data.period), as usage_events.charged_period.';
COMMENT ON COLUMN usage_borrowings.account IS 'The account that borrowed: an account of the request''s path below the org.';
COMMENT ON COLUMN usage_borrowings.lender IS 'The account it borrowed from: its parent, the node before it in the path.';
COMMENT ON COLUMN usage_borrowings.units IS 'Units of unit taken beyond the account''s guaranteed rate, out of the lender''s spare capacity.';

-- Chargeback: per org, borrower, lender, unit and month charged, the requests that borrowed
-- and the units they borrowed. Voided requests are left out (billable_events.void_reason);
-- 5xx outcomes are not: the capacity was taken.
CREATE VIEW finance_borrowing AS
SELECT b.org, b.account, b.lender, b.unit, to_char(b.charged_period, 'YYYY-MM') AS period,
       count(*) AS events, sum(b.units)::bigint AS units
FROM usage_borrowings b
JOIN billable_events e ON e.event_id = b.event_id AND e.billing_period = b.billing_period
WHERE e.void_reason IS NULL
GROUP BY b.org, b.account, b.lender, b.unit, b.charged_period;

COMMENT ON VIEW finance_borrowing IS 'Chargeback of borrowed rate capacity: per org, account, lender (its parent), unit and period charged (YYYY-MM), the requests that borrowed (events) and the units borrowed, voided requests left out. Refunds and settlements do not change borrowed units.';

-- +goose Down
DROP VIEW finance_borrowing;
DROP TABLE usage_borrowings;
