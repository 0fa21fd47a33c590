-- +goose Up
-- Every Kafka message the meter cannot parse or validate lands here with its raw bytes, so
-- nothing is lost and the pipeline moves on. A redelivered message is the same
-- (topic, partition, offset) and is kept once.
CREATE TABLE dead_letters (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic       text        NOT NULL,
    "partition" integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    key         bytea,
    value       bytea       NOT NULL,
    error       text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dead_letters_position_key UNIQUE (topic, "partition", "offset")
);

COMMENT ON TABLE dead_letters IS 'Kafka messages the meter could not parse or validate, kept verbatim.';

-- +goose Down
DROP TABLE dead_letters;
