-- +goose Up
-- Shadow mode (issue 20): an account, or a plan, whose requests are decided and recorded
-- as usual but never refused. A refusal is counted (metrics, the event's shadow_refusal)
-- and the request admitted: it takes no rate capacity, as a refused one, and it is billed
-- (its quotas charged, its credits drawn when they cover it). A request is in shadow when
-- its account or an account above it is, or the plan of one of them (or ADMIT_SHADOW).
ALTER TABLE accounts ADD COLUMN shadow boolean NOT NULL DEFAULT false;
ALTER TABLE plans ADD COLUMN shadow boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN accounts.shadow IS 'Decide and record this account''s requests, and those of the accounts below it, but never refuse them (docs/admission.md, "Shadow mode").';
COMMENT ON COLUMN plans.shadow IS 'Decide and record the requests of the accounts on this plan, and of those below them, but never refuse them.';

-- What shadow mode let pass: the refusal an admitted request would have had.
ALTER TABLE usage_events ADD COLUMN shadow_refusal text
    CHECK (shadow_refusal IN ('rate_limited', 'quota_exceeded', 'insufficient_balance'));
COMMENT ON COLUMN usage_events.shadow_refusal IS 'The refusal shadow mode let pass (data.shadow_refusal): the request was admitted and billed, but would have been refused.';

-- +goose Down
ALTER TABLE usage_events DROP COLUMN shadow_refusal;
ALTER TABLE plans DROP COLUMN shadow;
ALTER TABLE accounts DROP COLUMN shadow;
