-- void.lua: voids a request whose decision no caller was told (admit answered 503 after the
-- script call timed out, or the caller hung up first): the decision may have been taken,
-- and must then bill nothing. It appends a usage.voided event to the outbox, which the
-- meter records and reconcile refunds, and releases the decision's leases.
--
-- A request is an attempt: its own event id, and the decision it was answered with (its own
-- when decided afresh, an earlier one when replayed by its idempotency key). A decision is
-- void only when every attempt answered with it was voided: one replay told 200 bills it.
--
-- KEYS[1]  the shard's outbox stream
-- KEYS[2]  the idempotency record of the request (absent: the request had no key)
-- ARGV[1]  the attempt's event id
-- ARGV[2]  the shard's key start ("<prefix>{N}:"): void marks and lease records
-- ARGV[3]  org (the Kafka key)
-- ARGV[4]  how long a void mark lives, ms (the idempotency TTL)
-- ARGV[5]  event JSON from the id's end to the time; ARGV[6] from the time to the voided
--          event's id; ARGV[7] the rest
--
-- Returns 1 when a decision was voided (its event appended), 0 when another attempt of it
-- may have been answered. Running it twice for one attempt voids nothing more: the event
-- appended again has the same id, which the meter deduplicates.
local time = redis.call('TIME')
local attempt, tag = ARGV[1], ARGV[2]
local voided = attempt
if KEYS[2] then
  local record = redis.call('GET', KEYS[2])
  if record then
    local head, attempts = string.match(record, '^([^\n]*)\n?(.*)$')
    local id = string.match(head, '^(%S+)')
    if attempts == '' then attempts = id end
    local rest, found = {}, false
    for a in string.gmatch(attempts, '%S+') do
      if a == attempt and not found then found = true else rest[#rest + 1] = a end
    end
    if found and #rest > 0 then
      redis.call('SET', KEYS[2], head .. '\n' .. table.concat(rest, ' '), 'KEEPTTL')
      return 0
    end
    if found then
      voided = id
      redis.call('DEL', KEYS[2])
    end
  end
  -- A decision of this request taken after this call (it was still queued) is voided too:
  -- a replay of it decides afresh (admit.lua).
  redis.call('SET', tag .. 'v:' .. voided, '1', 'PX', tonumber(ARGV[4]))
end
local leases = tag .. 'l:' .. voided
local held = redis.call('GET', leases)
if held then
  for set in string.gmatch(held, '%S+') do redis.call('ZREM', set, voided) end
  redis.call('DEL', leases)
end
redis.call('XADD', KEYS[1], '*', 'k', ARGV[3], 'v', '{"specversion":"1.0","id":"' .. voided .. '/void' ..
  ARGV[5] .. rfc3339(tonumber(time[1]), tonumber(time[2])) .. ARGV[6] .. voided .. ARGV[7])
return 1
