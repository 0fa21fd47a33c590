-- credit_restore.lua: brings one credit grant in Redis back to its ledger (reconcile, after
-- Redis lost writes or everything): never above it. A grant missing from Redis is put back
-- with the ledger's remaining units and its terms; one above the ledger is lowered to it;
-- one at or below is left alone (the difference is draws not metered yet).
--
-- KEYS[1]  the grants' remaining units (admission.Keys.Grants)
-- KEYS[2]  their terms (admission.Keys.GrantTerms)
-- KEYS[3]  the grant's void marker (admission.Keys.GrantVoided): a grant voided in Redis,
--          whose void PostgreSQL has not recorded yet, is left out
-- ARGV[1]  grant id; ARGV[2] the ledger's remaining units; ARGV[3] the terms
--
-- Reply: {before (-1 when missing), after}; {-2, -2} when voided.
local id, ledger = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {-2, -2}
end
local cur = redis.call('HGET', KEYS[1], id)
redis.call('HSETNX', KEYS[2], id, ARGV[3])
if not cur then
  redis.call('HSET', KEYS[1], id, ARGV[2])
  return {-1, ledger}
end
cur = tonumber(cur)
if cur > ledger then
  redis.call('HSET', KEYS[1], id, ARGV[2])
  return {cur, ledger}
end
return {cur, cur}
