-- +goose Up
-- A plan's recurring credit grant (issue 18): every account that names the plan gets
-- amount units of unit at the start of each month, usable until the month ends (credit not
-- used lapses with the month). Reconcile issues them, exactly once per account, unit and
-- month: the grant's idempotency key is "plan:<plan>:<unit>:<YYYY-MM>".
CREATE TABLE plan_grants (
    plan     text    NOT NULL REFERENCES plans (id) ON DELETE CASCADE,
    unit     text    NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    amount   bigint  NOT NULL CHECK (amount > 0),
    priority integer NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 100),
    PRIMARY KEY (plan, unit)
);

COMMENT ON TABLE plan_grants IS 'Recurring credit grants of a plan: amount units of unit to every account naming the plan, each month, expiring at its end; issued once per account, unit and month by reconcile (credit_grants.source = plan).';

-- +goose Down
DROP TABLE plan_grants;
