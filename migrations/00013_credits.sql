-- +goose Up
-- Prepaid credits (issue 18). A grant gives an account a balance of a unit; the admission
-- script draws every request that carries the unit from the balances of the accounts of its
-- path that have one, in the same call as every limit, all-or-nothing, never below zero
-- (402 insufficient_balance). Redis holds each grant's remaining units (the balance the
-- script decides on); PostgreSQL holds the ledger it must tie out with:
--
--   remaining = amount - consumed + refunded - voided - expired      (per grant, >= 0)
--
-- consumed: what admitted requests drew (credit_consumptions, from the usage events, one row
-- per request and grant, written by the meter with the request's usage_events row);
-- refunded: what reconcile gave back (credit_adjustments: a request that bills nothing, a
-- 5xx or a void, gives back all it drew; a settlement to fewer actual units gives back the
-- difference); voided: what was left of a grant when it was voided; expired: what was left
-- of it when it expired. A Redis wipe never creates credit: reconcile restores each grant's
-- remaining from this ledger, never above it.

CREATE TABLE credit_grants (
    id              text        PRIMARY KEY CHECK (id ~ '^gr_[0-9a-f]{32}$'),
    org             text        NOT NULL,
    account         text        NOT NULL REFERENCES accounts (id),
    unit            text        NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    amount          bigint      NOT NULL CHECK (amount > 0),
    effective_at    timestamptz NOT NULL,
    expires_at      timestamptz,
    priority        integer     NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 100),
    source          text        NOT NULL CHECK (source IN ('purchase', 'promotional', 'plan')),
    idempotency_key text        CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    created_at      timestamptz NOT NULL DEFAULT now(),
    voided_at       timestamptz,
    voided_units    bigint      CHECK (voided_units >= 0),
    CONSTRAINT credit_grants_expiry CHECK (expires_at > effective_at),
    CONSTRAINT credit_grants_void CHECK ((voided_at IS NULL) = (voided_units IS NULL)),
    CONSTRAINT credit_grants_idempotency UNIQUE (account, idempotency_key)
);

CREATE INDEX credit_grants_account_idx ON credit_grants (account, unit);

COMMENT ON TABLE credit_grants IS 'Prepaid balances: a grant of amount units of unit to account, usable from effective_at until expires_at (NULL: no expiry), drawn by priority (higher first), then earliest expiry. A retried grant with the same idempotency_key is the same grant.';
COMMENT ON COLUMN credit_grants.source IS 'purchase (bought), promotional (given), plan (a plan''s recurring grant, issued once per period).';
COMMENT ON COLUMN credit_grants.voided_units IS 'What Redis held of the grant when it was voided (DELETE), taken out of the balance at once. The ledger''s voided is what is left of the grant after every draw and refund, whenever they are metered.';

-- An account with a grant (any, even spent or voided) is drawn from: the policy cache
-- loads which accounts have one, so grants notify like the other policy tables.
CREATE TRIGGER credit_grants_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON credit_grants
    FOR EACH STATEMENT EXECUTE FUNCTION policy_notify();

CREATE TABLE credit_consumptions (
    event_id       text        NOT NULL,
    grant_id       text        NOT NULL,
    billing_period date        NOT NULL,
    charged_period date        NOT NULL CHECK (extract(day FROM charged_period) = 1),
    event_time     timestamptz NOT NULL,
    ingest_time    timestamptz NOT NULL DEFAULT now(),
    org            text        NOT NULL,
    account        text        NOT NULL,
    unit           text        NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    units          bigint      NOT NULL CHECK (units > 0),
    PRIMARY KEY (event_id, grant_id),
    CONSTRAINT credit_consumptions_billing_period CHECK (billing_period = date_trunc('month', event_time AT TIME ZONE 'UTC')::date)
);

CREATE INDEX credit_consumptions_grant_idx ON credit_consumptions (grant_id);

COMMENT ON TABLE credit_consumptions IS 'What an admitted request drew from a grant (data.credits of io.metergate.usage.admitted.v1), written by the meter with the request''s usage_events row; a redelivered event is absorbed by the key.';

CREATE TABLE credit_adjustments (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('refund', 'settle', 'restore')),
    grant_id     text        NOT NULL REFERENCES credit_grants (id),
    event_id     text,
    units        bigint      NOT NULL,
    redis_before bigint,
    redis_after  bigint,
    reason       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    applied_at   timestamptz,
    CONSTRAINT credit_adjustments_event CHECK ((kind = 'restore') = (event_id IS NULL)),
    CONSTRAINT credit_adjustments_units CHECK (kind = 'restore' OR units > 0),
    CONSTRAINT credit_adjustments_applied CHECK ((applied_at IS NULL) = (redis_after IS NULL))
);

-- A refund or settlement of a request's draw on a grant is computed once, whichever run
-- computes it first, and applied to Redis exactly once (lua/adjust.lua's marker).
CREATE UNIQUE INDEX credit_adjustments_event_key ON credit_adjustments (kind, event_id, grant_id) WHERE event_id IS NOT NULL;
CREATE INDEX credit_adjustments_pending_idx ON credit_adjustments (id) WHERE applied_at IS NULL;

COMMENT ON TABLE credit_adjustments IS 'Reconcile''s corrections of balances: refund (a request that bills nothing gives back what it drew), settle (fewer actual units than drawn gives back the difference), restore (a Redis remaining found above the ledger, or missing after a wipe, set from it; units = the change, informational). refund and settle are ledger entries; restore is not (it changes Redis, not the books).';

-- The ledger per grant, at the time of the query.
CREATE VIEW finance_credit_grants AS
SELECT g.id AS grant_id, g.org, g.account, g.unit, g.source, g.priority, g.effective_at, g.expires_at,
       g.amount, l.consumed, l.refunded,
       CASE WHEN g.voided_at IS NOT NULL THEN greatest(0, g.amount - l.consumed + l.refunded) ELSE 0 END AS voided,
       CASE WHEN g.voided_at IS NULL AND g.expires_at <= now()
            THEN greatest(0, g.amount - l.consumed + l.refunded) ELSE 0 END AS expired,
       CASE WHEN g.voided_at IS NULL AND (g.expires_at IS NULL OR g.expires_at > now())
            THEN g.amount - l.consumed + l.refunded ELSE 0 END AS remaining
FROM credit_grants g
CROSS JOIN LATERAL (
    SELECT coalesce((SELECT sum(units) FROM credit_consumptions c WHERE c.grant_id = g.id), 0)::bigint AS consumed,
           coalesce((SELECT sum(units) FROM credit_adjustments a WHERE a.grant_id = g.id AND a.kind IN ('refund', 'settle')), 0)::bigint AS refunded
) l;

COMMENT ON VIEW finance_credit_grants IS 'Each grant''s ledger now: amount - consumed + refunded - voided - expired = remaining (the balance it adds). A voided or expired grant''s remaining is 0: what was left of it is voided or expired, and a refund of a draw made before stays there.';

CREATE VIEW finance_credit_balances AS
SELECT org, account, unit, sum(amount)::bigint AS granted, sum(consumed)::bigint AS consumed,
       sum(refunded)::bigint AS refunded, sum(voided)::bigint AS voided, sum(expired)::bigint AS expired,
       sum(remaining)::bigint AS balance
FROM finance_credit_grants
GROUP BY org, account, unit;

COMMENT ON VIEW finance_credit_balances IS 'Balances per account and unit now, tying out: balance = granted - consumed + refunded - voided - expired.';

-- +goose Down
DROP VIEW finance_credit_balances;
DROP VIEW finance_credit_grants;
DROP TABLE credit_adjustments;
DROP TABLE credit_consumptions;
DROP TRIGGER credit_grants_notify ON credit_grants;
DROP TABLE credit_grants;
