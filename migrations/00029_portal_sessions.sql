-- +goose Up
-- Portal sessions (issue 33, docs/portal.md#portal-sessions): one-time links the operator's
-- backend asks for (POST /v1/admin/portal-sessions) and hands to a customer, who opens it
-- once to get a cookie session of the portal, Stripe's customer portal being the model.
--
-- A link is a random code; PostgreSQL keeps its SHA-256 only, with the account and scopes
-- the session will have, where the portal's "Back" link goes (return_url), who made it,
-- and until when it may be opened (minutes). Opening it makes a customer token of one hour
-- (customer_tokens; token_id) and marks the link opened: a second opening finds no
-- unopened row and is refused.
--
-- No foreign keys, as for customer_tokens: the row says who made a link for whom whatever
-- becomes of the account, and opening a link joins the account by id and org.

CREATE TABLE portal_sessions (
    id         text        PRIMARY KEY CHECK (id ~ '^ps_[0-9a-f]{16}$'),
    account    text        NOT NULL CHECK (account ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    org        text        NOT NULL CHECK (org ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    scopes     text[]      NOT NULL CHECK (cardinality(scopes) >= 1
        AND scopes <@ ARRAY['usage:read', 'billing:read', 'keys:write', 'accounts:write']::text[]),
    return_url text        NOT NULL CHECK (length(return_url) <= 2000 AND return_url ~ '^https?://[^/?#]'),
    code_hash  bytea       NOT NULL UNIQUE CHECK (length(code_hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text        NOT NULL,
    expires_at timestamptz NOT NULL,
    opened_at  timestamptz,
    -- The customer token its opening made (customer_tokens.id).
    token_id   text        UNIQUE,
    -- A link is opened within minutes or never: the store's LinkTTL is 5 minutes.
    CONSTRAINT portal_sessions_link_lifetime CHECK (expires_at > created_at AND expires_at <= created_at + interval '1 hour'),
    CONSTRAINT portal_sessions_opened CHECK ((opened_at IS NULL) = (token_id IS NULL)
        AND (opened_at IS NULL OR opened_at <= expires_at))
);

COMMENT ON TABLE portal_sessions IS 'One-time links to the customer portal: the SHA-256 of the link''s code, the account and scopes of the session it opens, the return_url of its Back link, and until when it may be opened. Opened once (opened_at), it made the customer token token_id.';

-- +goose Down
DROP TABLE portal_sessions;
