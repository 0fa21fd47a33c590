-- grant.lua: mirrors one credit grant into Redis (internal/credit.Store.Mirror), after it was
-- committed to PostgreSQL. Running it again for the same grant (a retried grant, a restore)
-- never adds the amount twice: the remaining units are set only when the grant has none.
--
-- KEYS[1]  remaining: the hash grant id → remaining units (admission.Keys.Grants)
-- KEYS[2]  terms: the hash grant id → "<priority>|<effective ms>|<expires ms, 0 = never>"
--          (admission.Keys.GrantTerms)
-- KEYS[3]  void marker of the grant (grant_void.lua): a voided grant is never mirrored again
-- ARGV[1]  id: the grant id
-- ARGV[2]  amount: the grant's units, a positive integer
-- ARGV[3]  terms: the grant's terms, as in KEYS[2]
--
-- Returns a code: "mirrored" (this call set the remaining units), "present" (the grant was
-- there already: its remaining units are left as they are, the terms are written again) or
-- "voided" (the grant was voided: nothing is written).
local remaining, terms, marker = KEYS[1], KEYS[2], KEYS[3]
local id, amount, grant_terms = ARGV[1], ARGV[2], ARGV[3]
local n = tonumber(amount)
if not n or n <= 0 or n ~= math.floor(n) then
  return redis.error_reply('ERR amount must be a positive integer')
end
if redis.call('EXISTS', marker) == 1 then
  return 'voided'
end
local set = redis.call('HSETNX', remaining, id, amount)
redis.call('HSET', terms, id, grant_terms)
if set == 1 then
  return 'mirrored'
end
return 'present'
