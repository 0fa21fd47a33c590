-- +goose Up
-- Sealed books (issue 28, finding 6). Two halves:
--
-- 1. Triggers. An issued invoice, its lines and its late events are sealed: no row of them
--    may be added, changed or removed, except that the transaction that issued an invoice
--    adds its lines and late events (internal/invoice's close inserts the invoice as issued, then
--    its lines and late events, in one transaction). That transaction is stamped on the
--    invoice (issued_xact, set by a trigger whatever the INSERT says, and never changed
--    since UPDATE is refused). invoice_late_events is append-only; so is periods (a closed
--    month's closed_at decides which events are late). adjustments and credit_adjustments
--    are audit rows: the only change allowed is reconcile's marking of a pending row as
--    applied. TRUNCATE of any of these tables is refused.
--
-- 2. Roles. Triggers bind everyone, but a table's owner can disable or drop them, so the
--    services must not own the tables: migrations run as an owner role
--    (DATABASE_MIGRATE_URL), the services as a login that is a member of the group role
--    metergate_app (DATABASE_URL), which gets SELECT, INSERT, UPDATE, DELETE on the tables,
--    and neither TRUNCATE, TRIGGER, REFERENCES nor CREATE on the schema. Default privileges
--    give it the same on what later migrations create (run them as the same owner). The
--    monthly partitions of usage_events are created at run time by the meter through
--    usage_events_partition, which now runs as its owner (SECURITY DEFINER, search_path
--    pinned): the owner owns every partition, and the default privileges give the services
--    theirs. docs/deploy.md#database-roles says how to set the roles up.

-- The services' group role. Roles belong to the server, not to a database: when it is
-- missing and the migrating role may not create roles, an administrator creates it first.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'metergate_app') THEN
        BEGIN
            CREATE ROLE metergate_app NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL; -- created meanwhile by the migration of another schema
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'the role metergate_app does not exist and % may not create it', current_user
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = 'As an administrator: CREATE ROLE metergate_app NOLOGIN; GRANT metergate_app TO <the services'' login> (docs/deploy.md#database-roles).';
        END;
    END IF;
END
$$;
-- +goose StatementEnd

-- The transaction that issued an invoice: lines and late events are added in it alone.
ALTER TABLE invoices ADD COLUMN issued_xact xid8;

COMMENT ON COLUMN invoices.issued_xact IS 'The transaction that issued the invoice (pg_current_xact_id(), top level), set by the trigger invoices_stamp_issue: only it may add the invoice''s lines and late events. NULL for invoices issued before migration 00019: sealed.';
COMMENT ON TABLE invoices IS 'One invoice per org and closed period; sealed once issued: triggers refuse UPDATE, DELETE and TRUNCATE, and lines or late events added by another transaction than the one that issued it (migration 00019).';
COMMENT ON TABLE invoice_lines IS 'Lines of an invoice; added only by the transaction that issued it, never changed or removed.';
COMMENT ON TABLE invoice_late_events IS 'Late events (of a closed period) and the invoice that billed them; append-only, rows added only by the transaction that issued that invoice.';

-- +goose StatementBegin
CREATE FUNCTION invoice_stamp_issue() RETURNS trigger LANGUAGE plpgsql AS $$
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

COMMENT ON FUNCTION invoice_stamp_issue() IS 'Stamps the issuing transaction on an invoice, whatever the statement wrote.';

-- Reached only for rows that are not issued: invoices_immutable refuses the others first.
CREATE TRIGGER invoices_stamp_issue BEFORE INSERT OR UPDATE ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoice_stamp_issue();

-- A row of invoice_lines or invoice_late_events names its invoice: it may be written only
-- by the transaction that issued that invoice. An invoice this transaction cannot see (not
-- committed yet by another one) is refused here too: the foreign key's check, at the end of
-- the statement, could find it committed by then and let the row in.
-- +goose StatementBegin
CREATE FUNCTION invoice_sealed_insert() RETURNS trigger LANGUAGE plpgsql AS $$
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

COMMENT ON FUNCTION invoice_sealed_insert() IS 'Refuses a row of invoice_lines or invoice_late_events for an issued invoice, unless written by the transaction that issued it.';

-- invoice_lines: UPDATE and DELETE of an issued invoice's line were refused by
-- invoice_lines_immutable (00005, on the old row); this checks the new row.
CREATE TRIGGER invoice_lines_sealed BEFORE INSERT OR UPDATE ON invoice_lines
    FOR EACH ROW EXECUTE FUNCTION invoice_sealed_insert();
CREATE TRIGGER invoice_late_events_sealed BEFORE INSERT ON invoice_late_events
    FOR EACH ROW EXECUTE FUNCTION invoice_sealed_insert();

-- Tables whose rows, once written, are never changed or removed (TG_ARGV[0]: what the table
-- is, for the message).
-- +goose StatementBegin
CREATE FUNCTION append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (%): % refused', TG_TABLE_NAME, TG_ARGV[0], TG_OP
        USING ERRCODE = 'raise_exception';
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION append_only() IS 'Refuses UPDATE, DELETE and TRUNCATE on an append-only table.';

CREATE TRIGGER invoice_late_events_append_only BEFORE UPDATE OR DELETE ON invoice_late_events
    FOR EACH ROW EXECUTE FUNCTION append_only('a late event is billed once, by the invoice named here');
CREATE TRIGGER invoice_late_events_no_truncate BEFORE TRUNCATE ON invoice_late_events
    FOR EACH STATEMENT EXECUTE FUNCTION append_only('a late event is billed once, by the invoice named here');
CREATE TRIGGER periods_append_only BEFORE UPDATE OR DELETE ON periods
    FOR EACH ROW EXECUTE FUNCTION append_only('a closed month stays closed, and its closed_at decides which events are late');
CREATE TRIGGER periods_no_truncate BEFORE TRUNCATE ON periods
    FOR EACH STATEMENT EXECUTE FUNCTION append_only('a closed month stays closed, and its closed_at decides which events are late');

-- Audit rows of reconcile: the one change is the marking of a pending correction as applied
-- (applied_at, redis_before and redis_after set once, nothing else changed). DELETE is not
-- refused yet: BenchmarkReconcile (internal/reconcile) undoes its runs by deleting them.
-- +goose StatementBegin
CREATE FUNCTION adjustment_sealed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION '% holds audit rows: TRUNCATE refused', TG_TABLE_NAME
            USING ERRCODE = 'raise_exception';
    END IF;
    IF OLD.applied_at IS NOT NULL THEN
        RAISE EXCEPTION '% row % is applied and sealed: UPDATE refused', TG_TABLE_NAME, OLD.id
            USING ERRCODE = 'raise_exception';
    END IF;
    IF NEW.applied_at IS NULL
        OR to_jsonb(NEW) - '{applied_at,redis_before,redis_after}'::text[]
           IS DISTINCT FROM to_jsonb(OLD) - '{applied_at,redis_before,redis_after}'::text[] THEN
        RAISE EXCEPTION '% row % is an audit row: UPDATE refused (only marking it applied is allowed)', TG_TABLE_NAME, OLD.id
            USING ERRCODE = 'raise_exception';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION adjustment_sealed() IS 'Allows an UPDATE of an adjustments or credit_adjustments row only when it marks a pending row applied; refuses TRUNCATE.';

CREATE TRIGGER adjustments_sealed BEFORE UPDATE ON adjustments
    FOR EACH ROW EXECUTE FUNCTION adjustment_sealed();
CREATE TRIGGER adjustments_no_truncate BEFORE TRUNCATE ON adjustments
    FOR EACH STATEMENT EXECUTE FUNCTION adjustment_sealed();
CREATE TRIGGER credit_adjustments_sealed BEFORE UPDATE ON credit_adjustments
    FOR EACH ROW EXECUTE FUNCTION adjustment_sealed();
CREATE TRIGGER credit_adjustments_no_truncate BEFORE TRUNCATE ON credit_adjustments
    FOR EACH STATEMENT EXECUTE FUNCTION adjustment_sealed();

-- The services' privileges, in the schema the migrations run in (public, or a schema named
-- by the URL's search_path).
-- +goose StatementBegin
DO $$
DECLARE
    s text := quote_ident(current_schema());
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %s TO metergate_app', s);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO metergate_app', s);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %s TO metergate_app', s);
    EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %s TO metergate_app', s);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %s GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO metergate_app', s);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %s GRANT USAGE, SELECT ON SEQUENCES TO metergate_app', s);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %s GRANT EXECUTE ON FUNCTIONS TO metergate_app', s);
    -- Which migrations ran is the owner's to say.
    IF to_regclass('goose_db_version') IS NOT NULL THEN
        REVOKE INSERT, UPDATE, DELETE ON goose_db_version FROM metergate_app;
    END IF;
    -- The meter adds the month partitions of usage_events: as the owner, in this schema
    -- whatever the caller's search_path (no pg_temp table can stand in for usage_events).
    EXECUTE format('ALTER FUNCTION usage_events_partition(date) SECURITY DEFINER SET search_path = %s, pg_temp', s);
    REVOKE EXECUTE ON FUNCTION usage_events_partition(date) FROM PUBLIC;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The role metergate_app stays: it belongs to the server, and other schemas may use it.
-- +goose StatementBegin
DO $$
DECLARE
    s text := quote_ident(current_schema());
BEGIN
    ALTER FUNCTION usage_events_partition(date) SECURITY INVOKER RESET search_path;
    GRANT EXECUTE ON FUNCTION usage_events_partition(date) TO PUBLIC;
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %s REVOKE ALL ON TABLES FROM metergate_app', s);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %s REVOKE ALL ON SEQUENCES FROM metergate_app', s);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %s REVOKE ALL ON FUNCTIONS FROM metergate_app', s);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %s FROM metergate_app', s);
    EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %s FROM metergate_app', s);
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %s FROM metergate_app', s);
    EXECUTE format('REVOKE ALL ON SCHEMA %s FROM metergate_app', s);
END
$$;
-- +goose StatementEnd

DROP TRIGGER credit_adjustments_no_truncate ON credit_adjustments;
DROP TRIGGER credit_adjustments_sealed ON credit_adjustments;
DROP TRIGGER adjustments_no_truncate ON adjustments;
DROP TRIGGER adjustments_sealed ON adjustments;
DROP FUNCTION adjustment_sealed();
DROP TRIGGER periods_no_truncate ON periods;
DROP TRIGGER periods_append_only ON periods;
DROP TRIGGER invoice_late_events_no_truncate ON invoice_late_events;
DROP TRIGGER invoice_late_events_append_only ON invoice_late_events;
DROP FUNCTION append_only();
DROP TRIGGER invoice_late_events_sealed ON invoice_late_events;
DROP TRIGGER invoice_lines_sealed ON invoice_lines;
DROP FUNCTION invoice_sealed_insert();
DROP TRIGGER invoices_stamp_issue ON invoices;
DROP FUNCTION invoice_stamp_issue();
ALTER TABLE invoices DROP COLUMN issued_xact;
COMMENT ON TABLE invoice_late_events IS 'Late events (of a closed period) and the invoice that billed them.';
COMMENT ON TABLE invoice_lines IS 'Lines of an invoice; immutable once the invoice is issued.';
COMMENT ON TABLE invoices IS 'One invoice per org and closed period; immutable once issued (a trigger refuses UPDATE, DELETE and TRUNCATE).';
