-- adjust.lua: applies one correction to one or more counters exactly once.
--
-- KEYS[1]       marker key of the correction (e.g. the adjustment id); its presence means
--               "already applied"
-- KEYS[2..n]    counters to change; all keys share one hash tag (one Redis Cluster slot)
-- ARGV[1]       delta, an integer (negative to give quota back)
-- ARGV[2]       marker TTL in milliseconds
-- ARGV[3..n]    per counter: the hash field to change, or "" for a plain string counter
--
-- Returns {applied, before_1, after_1, before_2, after_2, ...}: applied is 1 when this call
-- changed the counters and 0 when the marker was already there; on a replay the values
-- are the ones recorded when the correction was applied, so a caller that crashed after
-- the change can still record what it did.
local marker = KEYS[1]
local stored = redis.call('GET', marker)
if stored then
  local out = {0}
  for v in string.gmatch(stored, '[^,]+') do
    out[#out + 1] = tonumber(v)
  end
  return out
end

local delta = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
if not delta or delta ~= math.floor(delta) then
  return redis.error_reply('ERR delta must be an integer')
end
if not ttl or ttl <= 0 then
  return redis.error_reply('ERR marker TTL must be a positive integer')
end

local out = {1}
for i = 2, #KEYS do
  local field = ARGV[i + 1] or ''
  local before, after
  if field == '' then
    before = tonumber(redis.call('GET', KEYS[i]) or '0')
    after = redis.call('INCRBY', KEYS[i], delta)
  else
    before = tonumber(redis.call('HGET', KEYS[i], field) or '0')
    after = redis.call('HINCRBY', KEYS[i], field, delta)
  end
  out[#out + 1] = before
  out[#out + 1] = after
end
redis.call('SET', marker, table.concat(out, ',', 2), 'PX', ttl)
return out
