-- +goose Up
-- Idempotency answered from the billing log (issue 29, docs/admission.md "Idempotency"):
-- Redis keeps an idempotency record exactly for a short hot window; a retry of an older key
-- is looked up here by account and key (internal/billinglog), in the current and the previous
-- billing_period only.
--
-- On the partitioned table the index reaches every partition: CREATE INDEX builds it on
-- each existing one, and ATTACH PARTITION (usage_events_partition, run as the owner) builds
-- it on each new one. Partial: most requests carry no idempotency key, and those rows cost
-- the index nothing but the check of the predicate.
--
-- Building it takes a SHARE lock on each partition in turn: the meter's inserts wait for
-- the build of the partition they write (admission does not: Kafka holds the events
-- meanwhile). On a large log, build it beforehand on each partition with CREATE INDEX
-- CONCURRENTLY, same columns and predicate: this statement then attaches those indexes
-- instead of building (docs/deploy.md, "Idempotency").
CREATE INDEX usage_events_idempotency_idx ON usage_events (account, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

COMMENT ON INDEX usage_events_idempotency_idx IS 'The first admission of an idempotency key, per account: idempotency past the hot window (internal/billinglog).';

-- +goose Down
DROP INDEX usage_events_idempotency_idx;
