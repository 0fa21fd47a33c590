-- +goose Up
-- Customer tokens (issue 33, docs/portal.md): credentials the operator issues to one of its
-- customers for one account and everything below it, with scopes, for the customer API
-- and portal. Like a staff token, a token is stored as its SHA-256 only and shown once;
-- unlike one, it always ends: expires_at is at most 90 days after it was made.
--
-- No foreign key to accounts: a token's row stays (who made it, who revoked it) whatever
-- happens to its account, and every authentication joins the account by id and org, so a
-- token whose account is gone, or now in another org, is refused.

CREATE TABLE customer_tokens (
    id         text        PRIMARY KEY CHECK (id ~ '^ct_[0-9a-f]{16}$'),
    account    text        NOT NULL CHECK (account ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    org        text        NOT NULL CHECK (org ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    scopes     text[]      NOT NULL CHECK (cardinality(scopes) >= 1
        AND scopes <@ ARRAY['usage:read', 'billing:read', 'keys:write', 'accounts:write']::text[]),
    token_hash bytea       NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    name       text        NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text        NOT NULL,
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz,
    revoked_by text,
    -- Hours, not days: a day is 23 or 25 hours across a change of summer time in the
    -- session's time zone, and the bound is the store's MaxTTL, 2160 hours.
    CONSTRAINT customer_tokens_lifetime CHECK (expires_at > created_at AND expires_at <= created_at + interval '2160 hours'),
    CONSTRAINT customer_tokens_revoked CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);

-- The lists by org and by account (GET /v1/admin/customer-tokens?org=&account=).
CREATE INDEX customer_tokens_org_idx ON customer_tokens (org, created_at);
CREATE INDEX customer_tokens_account_idx ON customer_tokens (account, created_at);

COMMENT ON TABLE customer_tokens IS 'Customer tokens: what a customer may do (scopes) on one account and everything below it, until expires_at (at most 90 days) or revoked_at. The token is kept as its SHA-256 only; a token whose account is gone is refused.';

-- +goose Down
DROP TABLE customer_tokens;
