-- +goose Up
-- Guarantees with a ceiling, and a waiting priority (issue 17). A limit's ceiling makes its
-- token bucket a guarantee that may borrow its parent's spare capacity up to the ceiling
-- (policy.Limit.Ceiling); a priority orders the requests waiting for the same limit
-- (policy.Resolved.Priority). The constraints mirror policy.Limit.Validate, as in 00002;
-- that an org's override has no ceiling (an org has no parent to borrow from) is the
-- store's check, since account_limits does not know the account's kind.
--
-- Every column is added with a default that changes nothing, so the policies resolve as
-- before until someone writes a ceiling or a priority. The policy_notify triggers of 00002
-- fire on every row change of these tables whatever the columns, so they need nothing.

ALTER TABLE plan_limits
    ADD COLUMN ceiling bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT plan_limits_ceiling CHECK (ceiling = 0 OR (
        algorithm = 'token_bucket' AND burst > 0 AND ceiling >= burst));

ALTER TABLE account_limits
    ADD COLUMN ceiling bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT account_limits_ceiling CHECK (ceiling = 0 OR (
        algorithm = 'token_bucket' AND burst > 0 AND ceiling >= burst));

COMMENT ON COLUMN plan_limits.ceiling IS 'With a token bucket: its rate and burst are a guarantee (reserved at the parent), and the node may borrow the parent''s spare capacity up to ceiling per the same window; 0 = no ceiling (the bucket is a cap). Meaningful below the org only.';
COMMENT ON COLUMN account_limits.ceiling IS 'With a token bucket: its rate and burst are a guarantee (reserved at the parent), and the node may borrow the parent''s spare capacity up to ceiling per the same window; 0 = no ceiling (the bucket is a cap). Never on an org (the store refuses it).';

ALTER TABLE plans
    ADD COLUMN priority integer NOT NULL DEFAULT 0
        CONSTRAINT plans_priority CHECK (priority BETWEEN 0 AND 100);

ALTER TABLE accounts
    ADD COLUMN priority integer
        CONSTRAINT accounts_priority CHECK (priority BETWEEN 0 AND 100);

COMMENT ON COLUMN plans.priority IS 'Waiting priority of the orgs on this plan, 0-100, higher first; what an account gets when neither it nor an ancestor sets one. Set in SQL (no admin API for plans yet).';
COMMENT ON COLUMN accounts.priority IS 'Waiting priority, 0-100, higher first; NULL = the nearest ancestor''s, else the org''s plan''s.';

-- +goose Down
ALTER TABLE accounts DROP COLUMN priority;
ALTER TABLE plans DROP COLUMN priority;
ALTER TABLE account_limits DROP COLUMN ceiling;
ALTER TABLE plan_limits DROP COLUMN ceiling;
