-- +goose Up
-- Usage alerts (issue 19). A rule watches one unit of an account (or of every account on a
-- plan, unless the account has its own rule of the same kind, unit and period) and names
-- thresholds: percentages of a quota, or a balance falling below an amount or below a
-- percentage of what was granted. The admission script fires a threshold in the call that
-- crosses it and writes its io.metergate.usage.threshold.v1 event into the same outbox; the
-- meter records each one here once (its id is the threshold, the account, the unit and the
-- period, or for balances the grant that armed it), and webhook deliveries start from here.

CREATE TABLE alert_rules (
    id         text        PRIMARY KEY CHECK (id ~ '^al_[0-9a-f]{32}$'),
    account    text        REFERENCES accounts (id) ON DELETE CASCADE,
    plan       text        REFERENCES plans (id) ON DELETE CASCADE,
    unit       text        NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    kind       text        NOT NULL CHECK (kind IN ('quota_percent', 'balance_below', 'balance_percent')),
    period     text        NOT NULL DEFAULT 'month' CHECK (period IN ('month', 'day')),
    thresholds bigint[]    NOT NULL CHECK (cardinality(thresholds) BETWEEN 1 AND 10 AND 0 < ALL (thresholds)),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT alert_rules_owner CHECK ((account IS NULL) <> (plan IS NULL)),
    CONSTRAINT alert_rules_percent CHECK (kind = 'balance_below' OR 100 >= ALL (thresholds)),
    CONSTRAINT alert_rules_period CHECK (kind = 'quota_percent' OR period = 'month')
);

-- One rule per owner, kind, unit and period: an account's rule replaces its plan's.
CREATE UNIQUE INDEX alert_rules_account_idx ON alert_rules (account, kind, unit, period) WHERE account IS NOT NULL;
CREATE UNIQUE INDEX alert_rules_plan_idx ON alert_rules (plan, kind, unit, period) WHERE plan IS NOT NULL;

COMMENT ON TABLE alert_rules IS 'Usage alert rules: thresholds the admission script fires once per threshold and period (quota_percent) or per arming grant (balance_below, balance_percent). A plan''s rules apply to the accounts on the plan that have no rule of the same kind, unit and period.';
COMMENT ON COLUMN alert_rules.thresholds IS 'quota_percent and balance_percent: percentages (1-100) of the quota of the period, or of the units granted; balance_below: amounts in units.';

-- Rules reach every admit node like the other policy tables.
CREATE TRIGGER alert_rules_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON alert_rules
    FOR EACH STATEMENT EXECUTE FUNCTION policy_notify();

CREATE TABLE usage_alerts (
    id           text        PRIMARY KEY,
    event_time   timestamptz NOT NULL,
    ingest_time  timestamptz NOT NULL DEFAULT now(),
    org          text        NOT NULL,
    account      text        NOT NULL,
    path         text[]      NOT NULL,
    unit         text        NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    kind         text        NOT NULL CHECK (kind IN ('quota_percent', 'balance_below', 'balance_percent')),
    threshold    bigint      NOT NULL CHECK (threshold > 0),
    at_units     bigint      NOT NULL CHECK (at_units > 0),
    value        bigint      NOT NULL CHECK (value >= 0),
    period       text        NOT NULL,
    arming_grant text,
    triggered_by text        NOT NULL,
    admitted     boolean     NOT NULL,
    payload      jsonb       NOT NULL,
    CONSTRAINT usage_alerts_grant CHECK ((kind = 'quota_percent') = (arming_grant IS NULL))
);

CREATE INDEX usage_alerts_time_idx ON usage_alerts (event_time);
CREATE INDEX usage_alerts_account_idx ON usage_alerts (account, event_time);

COMMENT ON TABLE usage_alerts IS 'Thresholds crossed (io.metergate.usage.threshold.v1), one row per threshold event id, written by the meter; a redelivered event is the same row.';
COMMENT ON COLUMN usage_alerts.id IS 'The event id: "alert/<account>/<unit>/<threshold>/<period label or arming grant>" (threshold: p80 a quota''s 80 %, b5000 a balance below 5000, bp20 below 20 % of the units granted).';
COMMENT ON COLUMN usage_alerts.path IS 'The account path, org first, down to account.';
COMMENT ON COLUMN usage_alerts.threshold IS 'As the rule names it: a percentage, or an amount (balance_below).';
COMMENT ON COLUMN usage_alerts.at_units IS 'The threshold in units when it fired.';
COMMENT ON COLUMN usage_alerts.value IS 'quota_percent: the quota counter after the request that crossed it (before it, when that request was refused by the quota); balances: the balance after it.';
COMMENT ON COLUMN usage_alerts.period IS 'The period of the counter ("YYYY-MM", or "YYYY-MM-DD" for daily quotas); for balances the month the request was charged to.';
COMMENT ON COLUMN usage_alerts.arming_grant IS 'Balances: the latest grant of the account and unit when it fired; a later grant (a top-up) re-arms the threshold.';
COMMENT ON COLUMN usage_alerts.triggered_by IS 'The event id of the request that crossed the threshold.';
COMMENT ON COLUMN usage_alerts.admitted IS 'false when the request was refused by the quota (a 100 % threshold fires with the first refusal).';
COMMENT ON COLUMN usage_alerts.payload IS 'The CloudEvent as the meter received it: what webhooks deliver.';

-- +goose Down
DROP TABLE usage_alerts;
DROP TRIGGER alert_rules_notify ON alert_rules;
DROP TABLE alert_rules;
