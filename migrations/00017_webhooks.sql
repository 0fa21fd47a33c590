-- +goose Up
-- Webhooks (issue 19). An endpoint receives the events of the types it names, signed per the
-- Standard Webhooks specification with its secrets (internal/webhook). A usage_alerts row (one
-- per threshold event, written by the meter) makes one delivery per matching endpoint, by a
-- trigger, in the meter's own transaction: a delivery exists exactly when its alert does.
-- Deliverers (in the meter) claim due deliveries with a lease, POST outside any
-- transaction, and log every attempt. docs/webhooks.md has the rules.

CREATE TABLE webhook_endpoints (
    id                   text        PRIMARY KEY CHECK (id ~ '^wh_[0-9a-f]{32}$'),
    url                  text        NOT NULL CHECK (url ~ '^https?://' AND length(url) <= 2048),
    event_types          text[]      NOT NULL CHECK (cardinality(event_types) >= 1 AND event_types <@ ARRAY['usage.threshold.v1']),
    account              text        CHECK (length(account) BETWEEN 1 AND 64),
    enabled              boolean     NOT NULL DEFAULT true,
    disabled_reason      text,
    consecutive_failures integer     NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_endpoints_disabled CHECK (enabled = (disabled_reason IS NULL))
);

COMMENT ON TABLE webhook_endpoints IS 'Webhook endpoints: where the events of the types they name are POSTed, signed with their secrets (webhook_secrets).';
COMMENT ON COLUMN webhook_endpoints.event_types IS 'Short names of the CloudEvents types delivered: the suffix of io.metergate.<type>; known: usage.threshold.v1.';
COMMENT ON COLUMN webhook_endpoints.account IS 'Optional filter: an event matches when this account is any account of its path (= ANY (usage_alerts.path)), so an org''s filter takes its whole tree. NULL: every event.';
COMMENT ON COLUMN webhook_endpoints.enabled IS 'A disabled endpoint gets no new deliveries and its pending ones are not attempted until it is enabled again.';
COMMENT ON COLUMN webhook_endpoints.consecutive_failures IS 'Failed attempts in a row across the endpoint''s deliveries, reset by any delivered one and by enabling; the deliverer disables the endpoint when it reaches its limit (WEBHOOK_DISABLE_AFTER).';

CREATE TABLE webhook_secrets (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint   text        NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    secret     text        NOT NULL CHECK (secret ~ '^whsec_'),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz
);

-- One current secret per endpoint; the previous ones sign until they expire.
CREATE UNIQUE INDEX webhook_secrets_current_idx ON webhook_secrets (endpoint) WHERE expires_at IS NULL;
CREATE INDEX webhook_secrets_endpoint_idx ON webhook_secrets (endpoint, created_at);

COMMENT ON TABLE webhook_secrets IS 'SIGNING KEYS of the webhook endpoints, in clear ("whsec_" + base64): whoever reads this table can forge deliveries. Grant it to the meter and admit roles only.';
COMMENT ON COLUMN webhook_secrets.expires_at IS 'NULL: the current secret. After a rotation, the previous secret keeps signing (a second signature) until expires_at, so receivers can switch in that overlap.';

CREATE TABLE webhook_deliveries (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint         text        NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    alert            text        NOT NULL REFERENCES usage_alerts (id),
    status           text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_until      timestamptz,
    first_attempt_at timestamptz,
    delivered_at     timestamptz,
    last_status      integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_deliveries_once UNIQUE (endpoint, alert),
    CONSTRAINT webhook_deliveries_delivered CHECK ((status = 'delivered') = (delivered_at IS NOT NULL))
);

CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_alert_idx ON webhook_deliveries (alert);

COMMENT ON TABLE webhook_deliveries IS 'One delivery of an alert to an endpoint; its webhook-id is the alert id, the same on every attempt and replay.';
COMMENT ON COLUMN webhook_deliveries.lease_until IS 'Set by the deliverer that claimed the delivery (the attempt timeout plus a margin); until then no other deliverer takes it. A killed deliverer''s lease lapses and another retries.';
COMMENT ON COLUMN webhook_deliveries.first_attempt_at IS 'The first attempt since the delivery was queued (a replay starts it again): retries stop WEBHOOK_RETRY_FOR after it, with status failed.';
COMMENT ON COLUMN webhook_deliveries.last_status IS 'HTTP status of the last attempt; NULL when it got none (timeout, refused address, connection error: last_error).';

CREATE TABLE webhook_attempts (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery    bigint      NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    started_at  timestamptz NOT NULL,
    latency_us  bigint      NOT NULL CHECK (latency_us >= 0),
    http_status integer,
    error       text,
    outcome     text        NOT NULL CHECK (outcome IN ('delivered', 'failed'))
);

CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery, id);

COMMENT ON TABLE webhook_attempts IS 'The delivery log: every attempt with its time, latency, HTTP status (NULL: none) and error. An attempt cut short by a killed deliverer is not logged; its retry is.';

-- Every alert the meter inserts gets a pending delivery for each enabled endpoint that takes
-- usage.threshold.v1 and whose account filter is on the alert's path, in the same
-- transaction. The meter inserts alerts ON CONFLICT DO NOTHING: a redelivered event fires no
-- trigger, and the key absorbs anything else.
-- +goose StatementBegin
CREATE FUNCTION webhook_queue_alert() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER usage_alerts_webhooks AFTER INSERT ON usage_alerts
    FOR EACH ROW EXECUTE FUNCTION webhook_queue_alert();

-- +goose Down
DROP TRIGGER usage_alerts_webhooks ON usage_alerts;
DROP FUNCTION webhook_queue_alert();
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_secrets;
DROP TABLE webhook_endpoints;
