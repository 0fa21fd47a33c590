-- +goose Up
-- Policies: plans (tiers), the account tree, per-node limit overrides and API keys. admit
-- caches all of it in memory (internal/policy) and reloads when a trigger below notifies
-- 'metergate_policy'. The CHECK constraints mirror policy.Limit.Validate and the store's
-- validation, so a row written by hand cannot hold a limit the cache would misread.

-- The smallest plan (lowest rank) is what an account with an unknown or missing plan is
-- clamped to: never the largest.
CREATE TABLE plans (
    id          text        PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    rank        integer     NOT NULL UNIQUE,
    concurrency integer     NOT NULL DEFAULT 0 CHECK (concurrency >= 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE plans IS 'Tiers: defaults for accounts that name them. The lowest rank is the smallest plan, what unknown or missing plans clamp to.';
COMMENT ON COLUMN plans.concurrency IS 'Concurrent requests per node on this plan; 0 = no cap.';

-- A limit of one unit. The rate part (algorithm, rate_per_s, burst, limit, window_s) is a
-- token bucket (rate_per_s and burst, both 0 for none; limit and window_s only as the
-- "limit per window" form, kept beside the bucket it was normalized to) or a sliding window
-- (limit per window_s). The quota part is quota per quota_period, -1 uncapped, NULL none.
CREATE TABLE plan_limits (
    plan         text             NOT NULL REFERENCES plans (id) ON DELETE CASCADE,
    unit         text             NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    algorithm    text             NOT NULL DEFAULT 'token_bucket' CHECK (algorithm IN ('token_bucket', 'sliding_window')),
    rate_per_s   double precision NOT NULL DEFAULT 0 CHECK (rate_per_s >= 0 AND rate_per_s < 'Infinity'),
    burst        bigint           NOT NULL DEFAULT 0 CHECK (burst >= 0),
    "limit"      bigint           NOT NULL DEFAULT 0 CHECK ("limit" >= 0),
    window_s     bigint           NOT NULL DEFAULT 0 CHECK (window_s >= 0),
    quota        bigint           CHECK (quota >= -1),
    quota_period text             CHECK (quota_period IN ('month', 'day')),
    PRIMARY KEY (plan, unit),
    CONSTRAINT plan_limits_token_bucket CHECK (algorithm <> 'token_bucket' OR (
        (rate_per_s > 0) = (burst > 0)
        AND ("limit" > 0) = (window_s > 0)
        AND ("limit" = 0 OR burst = "limit"))),
    CONSTRAINT plan_limits_sliding_window CHECK (algorithm <> 'sliding_window' OR (
        "limit" > 0 AND window_s > 0 AND window_s <= 31 * 24 * 3600 AND rate_per_s = 0 AND burst = 0)),
    CONSTRAINT plan_limits_quota_period CHECK ((quota IS NULL) = (quota_period IS NULL)),
    CONSTRAINT plan_limits_not_empty CHECK (burst > 0 OR "limit" > 0 OR quota IS NOT NULL)
);

COMMENT ON TABLE plan_limits IS 'What a plan allows of each unit (see policy.Limit).';

INSERT INTO plans (id, rank) VALUES ('free', 0), ('pro', 1), ('enterprise', 2);
INSERT INTO plan_limits (plan, unit, rate_per_s, burst, quota, quota_period) VALUES
    ('free',       'requests',   10,    20,     50000, 'month'),
    ('pro',        'requests',  100,   300,   5000000, 'month'),
    ('enterprise', 'requests', 1000,  2000,        -1, 'month');

-- The account tree: org → team → user → agent, levels may be skipped. org is the root of
-- the node's tree (the invoiced customer); the composite foreign key keeps it equal to the
-- parent's org. plan has no foreign key on purpose: an account naming a plan that does not
-- exist (removed, or written by hand) is clamped to the smallest plan instead of failing;
-- the store refuses unknown plans on write. That a child's kind is deeper than its
-- parent's is checked by the store (kind and parent cannot change afterwards).
CREATE TABLE accounts (
    id          text        PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    kind        text        NOT NULL CHECK (kind IN ('org', 'team', 'user', 'agent')),
    parent      text,
    org         text        NOT NULL,
    plan        text,
    concurrency integer     CHECK (concurrency >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT accounts_id_org_key UNIQUE (id, org),
    CONSTRAINT accounts_org_fkey FOREIGN KEY (org) REFERENCES accounts (id),
    CONSTRAINT accounts_parent_fkey FOREIGN KEY (parent, org) REFERENCES accounts (id, org),
    CONSTRAINT accounts_root CHECK (CASE WHEN kind = 'org' THEN parent IS NULL AND org = id ELSE parent IS NOT NULL END)
);

CREATE INDEX accounts_parent_idx ON accounts (parent);

COMMENT ON TABLE accounts IS 'The account tree; org is the root (the invoiced customer). See internal/policy for how limits resolve.';
COMMENT ON COLUMN accounts.plan IS 'Plan id; unknown or NULL on an org = the smallest plan; NULL below the org = no plan limits at this node.';
COMMENT ON COLUMN accounts.concurrency IS 'Concurrent requests at this node; NULL = the plan''s (if the node names one), else no cap.';

-- Per-node overrides, laid over the node's plan limits field group by field group.
CREATE TABLE account_limits (
    account      text             NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    unit         text             NOT NULL CHECK (unit IN ('requests', 'tokens', 'credits', 'cost_micros')),
    algorithm    text             NOT NULL DEFAULT 'token_bucket' CHECK (algorithm IN ('token_bucket', 'sliding_window')),
    rate_per_s   double precision NOT NULL DEFAULT 0 CHECK (rate_per_s >= 0 AND rate_per_s < 'Infinity'),
    burst        bigint           NOT NULL DEFAULT 0 CHECK (burst >= 0),
    "limit"      bigint           NOT NULL DEFAULT 0 CHECK ("limit" >= 0),
    window_s     bigint           NOT NULL DEFAULT 0 CHECK (window_s >= 0),
    quota        bigint           CHECK (quota >= -1),
    quota_period text             CHECK (quota_period IN ('month', 'day')),
    PRIMARY KEY (account, unit),
    CONSTRAINT account_limits_token_bucket CHECK (algorithm <> 'token_bucket' OR (
        (rate_per_s > 0) = (burst > 0)
        AND ("limit" > 0) = (window_s > 0)
        AND ("limit" = 0 OR burst = "limit"))),
    CONSTRAINT account_limits_sliding_window CHECK (algorithm <> 'sliding_window' OR (
        "limit" > 0 AND window_s > 0 AND window_s <= 31 * 24 * 3600 AND rate_per_s = 0 AND burst = 0)),
    CONSTRAINT account_limits_quota_period CHECK ((quota IS NULL) = (quota_period IS NULL)),
    CONSTRAINT account_limits_not_empty CHECK (burst > 0 OR "limit" > 0 OR quota IS NOT NULL)
);

COMMENT ON TABLE account_limits IS 'Per-node limit overrides (see policy.Limit and the resolution rules in internal/policy).';

-- End-customer API keys. Only the SHA-256 of the secret is kept: the secret is shown once,
-- when the key is created. Revoked keys stay so callers get "revoked", not "unknown".
CREATE TABLE api_keys (
    id         text        PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    account    text        NOT NULL REFERENCES accounts (id),
    hash       bytea       NOT NULL UNIQUE CHECK (length(hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

CREATE INDEX api_keys_account_idx ON api_keys (account);

COMMENT ON TABLE api_keys IS 'API keys: SHA-256 of the secret only; the secret is never stored.';

-- Every change to a policy table tells the admit caches to reload. Per statement, so a bulk
-- load is one notification; PostgreSQL also folds identical notifications of a transaction
-- into one, delivered at commit.
-- +goose StatementBegin
CREATE FUNCTION policy_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('metergate_policy', TG_TABLE_NAME);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER plans_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON plans
    FOR EACH STATEMENT EXECUTE FUNCTION policy_notify();
CREATE TRIGGER plan_limits_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON plan_limits
    FOR EACH STATEMENT EXECUTE FUNCTION policy_notify();
CREATE TRIGGER accounts_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON accounts
    FOR EACH STATEMENT EXECUTE FUNCTION policy_notify();
CREATE TRIGGER account_limits_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON account_limits
    FOR EACH STATEMENT EXECUTE FUNCTION policy_notify();
CREATE TRIGGER api_keys_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION policy_notify();

-- +goose Down
DROP TABLE api_keys;
DROP TABLE account_limits;
DROP TABLE accounts;
DROP TABLE plan_limits;
DROP TABLE plans;
DROP FUNCTION policy_notify();
