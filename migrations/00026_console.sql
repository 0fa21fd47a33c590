-- +goose Up
-- The web console (issue 32, docs/console.md): its sessions, and the indexes its pages
-- search by.
--
-- A session is a cookie holding a random id; PostgreSQL keeps its SHA-256 only, with the
-- staff member it acts as, its CSRF token, and when it ends. Every page view looks the
-- session up (and the member: a revoked member's sessions end with it), so a session
-- revoked or expired is refused at once on every admit node.

CREATE TABLE console_sessions (
    id_hash    bytea       PRIMARY KEY CHECK (length(id_hash) = 32),
    staff_id   text        NOT NULL,
    role       text        NOT NULL CHECK (role IN ('admin', 'finance', 'support', 'viewer')),
    csrf       text        NOT NULL CHECK (length(csrf) >= 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz,
    CONSTRAINT console_sessions_ends CHECK (expires_at > created_at)
);

CREATE INDEX console_sessions_staff_idx ON console_sessions (staff_id) WHERE revoked_at IS NULL;
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);

COMMENT ON TABLE console_sessions IS 'Sessions of the web console: the SHA-256 of the cookie''s id, the staff member (a staff id, or admin-token) and role it acts as, its CSRF token, and its end (expires_at, or revoked_at). Rows past their end are deleted by the next login.';

-- The console's account search: by a prefix of the id (the primary key's index does not
-- serve LIKE under a non-C collation), and by a part of the customer's legal name.
CREATE INDEX accounts_id_prefix_idx ON accounts (id text_pattern_ops);

-- +goose Down
DROP INDEX accounts_id_prefix_idx;
DROP TABLE console_sessions;
