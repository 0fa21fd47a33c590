-- +goose Up
-- Staff identities and the audit log (issue 32). Staff hold named credentials with a role;
-- a token is stored as its SHA-256 only, shown once when made, and refused once revoked.
-- Every write through the admin API is a row of audit_log: who, when, what, before and
-- after; append-only like the invoices.

CREATE TABLE staff (
    id         text        PRIMARY KEY CHECK (id ~ '^st_[0-9a-f]{16}$'),
    name       text        NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    role       text        NOT NULL CHECK (role IN ('admin', 'finance', 'support', 'viewer')),
    token_hash bytea       NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text        NOT NULL,
    revoked_at timestamptz,
    revoked_by text,
    CONSTRAINT staff_revoked CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);

CREATE UNIQUE INDEX staff_name_live ON staff (name) WHERE revoked_at IS NULL;

COMMENT ON TABLE staff IS 'Named staff credentials with a role (admin, finance, support, viewer); the token is kept as its SHA-256 only. Revoked: refused from then on.';

CREATE TABLE audit_log (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text        NOT NULL,
    role       text        NOT NULL,
    method     text        NOT NULL,
    route      text        NOT NULL,
    path       text        NOT NULL,
    status     integer     NOT NULL,
    before     jsonb,
    after      jsonb
);

CREATE INDEX audit_log_at_idx ON audit_log (at);

COMMENT ON TABLE audit_log IS 'Every write through the admin API (and the console): who (a staff id, or admin-token), with which role, when, the route and path, the reply''s status, and what it changed (before and after, secrets left out). Append-only.';

CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION append_only('the audit trail of the admin API');
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION append_only('the audit trail of the admin API');

-- +goose Down
DROP TABLE audit_log;
DROP TABLE staff;
