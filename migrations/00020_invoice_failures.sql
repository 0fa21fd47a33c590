-- +goose Up
-- Invoices a close could not issue (issue 28, finding 3). One org's bad data (a usage total
-- past bigint, a price that cannot be applied, any error pricing or writing its invoice)
-- fails that org's invoice alone: the close issues every other org's and closes the period
-- (internal/invoice). Each failed attempt is a row here, never changed. An org's failure is open
-- while the org has no invoice for the period; a close of the period again retries the
-- open ones, and the unique (org, period) of invoices keeps it to one invoice.
CREATE TABLE invoice_failures (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    period    date        NOT NULL REFERENCES periods (period),
    org       text        NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    error     text        NOT NULL
);

CREATE INDEX invoice_failures_period_org_idx ON invoice_failures (period, org);

COMMENT ON TABLE invoice_failures IS 'Each attempt of a close to issue an org''s invoice that failed (append-only). Open while the org has no invoice for the period: reconcile close -period of that month retries it.';
COMMENT ON COLUMN invoice_failures.error IS 'Why the invoice was not issued, e.g. a total past bigint or a price version that does not validate.';

-- +goose StatementBegin
CREATE FUNCTION invoice_failures_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'invoice_failures is append-only: % refused', TG_OP USING ERRCODE = 'raise_exception';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER invoice_failures_append_only BEFORE UPDATE OR DELETE ON invoice_failures
    FOR EACH ROW EXECUTE FUNCTION invoice_failures_append_only();
CREATE TRIGGER invoice_failures_no_truncate BEFORE TRUNCATE ON invoice_failures
    FOR EACH STATEMENT EXECUTE FUNCTION invoice_failures_append_only();

-- The open failures: per period and org without an invoice, the attempts and the last error.
CREATE VIEW finance_invoice_failures AS
SELECT f.period, f.org, count(*) AS attempts, min(f.failed_at) AS first_failed_at, max(f.failed_at) AS last_failed_at,
       (array_agg(f.error ORDER BY f.failed_at DESC, f.id DESC))[1] AS last_error
FROM invoice_failures f
WHERE NOT EXISTS (SELECT 1 FROM invoices i WHERE i.org = f.org AND i.period = f.period)
GROUP BY f.period, f.org;

COMMENT ON VIEW finance_invoice_failures IS 'Orgs whose invoice for a closed period is not issued because the close failed for them: attempts, first and last failure, the last error. Empty when every due invoice is issued.';

-- +goose Down
DROP VIEW finance_invoice_failures;
DROP TABLE invoice_failures;
DROP FUNCTION invoice_failures_append_only();
