-- grant_balance.lua: reads an account's credit grants with the clock admission decides by
-- (internal/credit.Store.Balance), in one snapshot: no draw lands between the reads.
--
-- KEYS     pairs of (remaining, terms) hashes (admission.Keys.Grants, GrantTerms), one pair
--          per unit, all of one hash tag
--
-- Returns {seconds, microseconds, remaining_1, terms_1, remaining_2, terms_2, ...}: Redis
-- TIME, then each hash as HGETALL returns it (field, value, field, value, ...).
local time = redis.call('TIME')
local out = {time[1], time[2]}
for i = 1, #KEYS do
  out[#out + 1] = redis.call('HGETALL', KEYS[i])
end
return out
