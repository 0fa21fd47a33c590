-- grant_void.lua: takes what remains of a credit grant out of Redis, atomically with every
-- admission draw (internal/credit.Store.Void), and remembers how much it took.
--
-- KEYS[1]  remaining: the hash grant id → remaining units (admission.Keys.Grants)
-- KEYS[2]  terms: the hash grant id → terms (admission.Keys.GrantTerms)
-- KEYS[3]  marker: the grant's void marker; it holds the units the void took, so a retry
--          (a caller that crashed before recording the void in PostgreSQL) gets the same
--          answer, and grant.lua never mirrors the grant again
-- ARGV[1]  id: the grant id
-- ARGV[2]  marker_ttl: how long the marker lives, ms
--
-- Returns {applied, units}: applied is 1 when this call took the units, 0 when the marker
-- was there already (units are then what the first call took). A grant Redis does not
-- hold (never mirrored, or lost) gives 0 units.
local remaining, terms, marker = KEYS[1], KEYS[2], KEYS[3]
local id, marker_ttl = ARGV[1], tonumber(ARGV[2])
if not marker_ttl or marker_ttl <= 0 then
  return redis.error_reply('ERR marker TTL must be a positive integer')
end
local stored = redis.call('GET', marker)
if stored then
  return {0, tonumber(stored)}
end
local units = tonumber(redis.call('HGET', remaining, id) or '0') or 0
if units < 0 then units = 0 end
redis.call('HDEL', remaining, id)
redis.call('HDEL', terms, id)
redis.call('SET', marker, units, 'PX', marker_ttl)
return {1, units}
