-- +goose Up
-- Billing events to webhooks (issue 31): a billing_events row (00022: an invoice issued, an
-- invoice's status changed, a credit note issued) is delivered as an alert is (00017). A
-- trigger queues one delivery per matching endpoint in the transaction that writes the row,
-- so a delivery exists exactly when its event does; the deliverer signs, retries and logs
-- it, and a replay sends it again with the same webhook-id. docs/webhooks.md has the rules.

-- A delivery carries one event, an alert or a billing event, each under its own foreign key.
-- event is its id: the webhook-id of every attempt and replay. One delivery per endpoint and
-- webhook-id, since a receiver drops a webhook-id it has processed.
ALTER TABLE webhook_deliveries
    ALTER COLUMN alert DROP NOT NULL,
    ADD COLUMN billing_event text REFERENCES billing_events (id),
    ADD COLUMN event text GENERATED ALWAYS AS (coalesce(alert, billing_event)) STORED,
    ADD CONSTRAINT webhook_deliveries_one_event CHECK (num_nonnulls(alert, billing_event) = 1),
    DROP CONSTRAINT webhook_deliveries_once;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_once UNIQUE (endpoint, event);

CREATE INDEX webhook_deliveries_billing_event_idx ON webhook_deliveries (billing_event) WHERE billing_event IS NOT NULL;

COMMENT ON TABLE webhook_deliveries IS 'One delivery of an event (an alert or a billing event) to an endpoint; its webhook-id is the event id (event), the same on every attempt and replay.';
COMMENT ON COLUMN webhook_deliveries.alert IS 'The alert delivered (usage_alerts); NULL for a billing event.';
COMMENT ON COLUMN webhook_deliveries.billing_event IS 'The billing event delivered (billing_events); NULL for an alert.';
COMMENT ON COLUMN webhook_deliveries.event IS 'The id of the event delivered, an alert''s or a billing event''s: the webhook-id.';

-- Alert ids start with "alert/" (00016); a billing event's id may not, so no two events
-- share a webhook-id. Checked at the insert, whether or not an endpoint takes the event.
ALTER TABLE billing_events ADD CONSTRAINT billing_events_webhook_id CHECK (id !~ '^alert/');

ALTER TABLE webhook_endpoints
    DROP CONSTRAINT webhook_endpoints_event_types_check,
    ADD CONSTRAINT webhook_endpoints_event_types_check CHECK (cardinality(event_types) >= 1 AND event_types <@
        ARRAY['usage.threshold.v1', 'invoice.issued.v1', 'invoice.status_changed.v1', 'credit_note.issued.v1']);

COMMENT ON COLUMN webhook_endpoints.event_types IS 'Short names of the CloudEvents types delivered: the suffix of io.metergate.<type>; known: usage.threshold.v1, invoice.issued.v1, invoice.status_changed.v1, credit_note.issued.v1.';
COMMENT ON COLUMN webhook_endpoints.account IS 'Optional filter: an event matches when this account is any account of its path (webhook_takes): an org''s filter takes its whole tree; a billing event''s path is its org. NULL: every event.';

-- The one rule of which events an endpoint takes, for the triggers and a range replay.
-- +goose StatementBegin
CREATE FUNCTION webhook_takes(e webhook_endpoints, event_type text, path text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE AS $$
    SELECT event_type = ANY (e.event_types) AND (e.account IS NULL OR e.account = ANY (path))
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION webhook_takes(webhook_endpoints, text, text[]) IS 'Whether endpoint e takes an event of event_type on the account path (org first): it names the type, and its account filter is none or on the path. Enabled or not is the caller''s to check.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION webhook_queue_alert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (endpoint, alert)
    SELECT e.id, NEW.id
    FROM webhook_endpoints e
    WHERE e.enabled AND webhook_takes(e, 'usage.threshold.v1', NEW.path)
    ON CONFLICT ON CONSTRAINT webhook_deliveries_once DO NOTHING;
    PERFORM pg_notify('webhook_deliveries', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Every billing event the invoice code inserts gets a pending delivery for each enabled
-- endpoint that takes its type and whose account filter is none or its org, in the same
-- transaction. A billing event fires once: its primary key refuses the same id again, and
-- the table is append-only.
-- +goose StatementBegin
CREATE FUNCTION webhook_queue_billing_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (endpoint, billing_event)
    SELECT e.id, NEW.id
    FROM webhook_endpoints e
    WHERE e.enabled AND webhook_takes(e, NEW.type, ARRAY[NEW.org]);
    IF FOUND THEN -- a close writes an event per invoice: wake the deliverers only for work
        PERFORM pg_notify('webhook_deliveries', '');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER billing_events_webhooks AFTER INSERT ON billing_events
    FOR EACH ROW EXECUTE FUNCTION webhook_queue_billing_event();

-- +goose Down
DROP TRIGGER billing_events_webhooks ON billing_events;
DROP FUNCTION webhook_queue_billing_event();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION webhook_queue_alert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (endpoint, alert)
    SELECT e.id, NEW.id
    FROM webhook_endpoints e
    WHERE e.enabled AND 'usage.threshold.v1' = ANY (e.event_types) AND (e.account IS NULL OR e.account = ANY (NEW.path))
    ON CONFLICT ON CONSTRAINT webhook_deliveries_once DO NOTHING;
    PERFORM pg_notify('webhook_deliveries', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP FUNCTION webhook_takes(webhook_endpoints, text, text[]);

-- Billing events leave the webhooks: their deliveries (with their attempts) go, and so do
-- the endpoints that took nothing else.
DELETE FROM webhook_deliveries WHERE billing_event IS NOT NULL;
DELETE FROM webhook_endpoints WHERE NOT 'usage.threshold.v1' = ANY (event_types);
UPDATE webhook_endpoints SET event_types = ARRAY['usage.threshold.v1'] WHERE event_types <> ARRAY['usage.threshold.v1'];

ALTER TABLE webhook_endpoints
    DROP CONSTRAINT webhook_endpoints_event_types_check,
    ADD CONSTRAINT webhook_endpoints_event_types_check CHECK (cardinality(event_types) >= 1 AND event_types <@ ARRAY['usage.threshold.v1']);

COMMENT ON COLUMN webhook_endpoints.event_types IS 'Short names of the CloudEvents types delivered: the suffix of io.metergate.<type>; known: usage.threshold.v1.';
COMMENT ON COLUMN webhook_endpoints.account IS 'Optional filter: an event matches when this account is any account of its path (= ANY (usage_alerts.path)), so an org''s filter takes its whole tree. NULL: every event.';

ALTER TABLE billing_events DROP CONSTRAINT billing_events_webhook_id;

DROP INDEX webhook_deliveries_billing_event_idx;
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_once;
ALTER TABLE webhook_deliveries
    DROP CONSTRAINT webhook_deliveries_one_event,
    DROP COLUMN event,
    DROP COLUMN billing_event,
    ALTER COLUMN alert SET NOT NULL,
    ADD CONSTRAINT webhook_deliveries_once UNIQUE (endpoint, alert);

COMMENT ON TABLE webhook_deliveries IS 'One delivery of an alert to an endpoint; its webhook-id is the alert id, the same on every attempt and replay.';
COMMENT ON COLUMN webhook_deliveries.alert IS NULL;
