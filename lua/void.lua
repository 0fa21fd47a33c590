-- void.lua: voids a request whose decision no caller was told (admit answered 503 after the
-- script call timed out, or the caller hung up first): the decision may have been taken,
-- and must then bill nothing. It appends a usage.voided event to the outbox, which the
-- meter records and reconcile refunds, and releases the decision's leases.
--
-- A request is an attempt: its own event id, and the decision it was answered with (its own
-- when decided afresh, an earlier one when replayed by its idempotency key). A decision is
-- void only when every attempt answered with it was voided: one replay told 200 bills it.
--
-- KEYS[1]  outbox: the shard's outbox stream
-- ARGV[1]  attempt: the attempt's event id
-- ARGV[2]  tag: the shard's key start ("<prefix>{N}:"): void marks, lease records and
--          idempotency buckets
-- ARGV[3]  org (the Kafka key)
-- ARGV[4]  mark_ttl: how long a void mark lives, ms (as long as a record may be found)
-- ARGV[5]  after_id: event JSON from the id's end to the time; ARGV[6] after_time: from
--          the time to the voided event's id; ARGV[7] rest: the rest
-- ARGV[8]  idem: the field of the request's idempotency record ("": the request had no
--          key); ARGV[9] idem_w: the idempotency window, ms (admit.lua: the record is in
--          "<tag>i:<floor(now / W)>" or the bucket before); ARGV[10] legacy: the key of a
--          record of the one-key-per-record layout, looked up last ("": none)
-- ARGV[11] id_tail: how the org's event ids end (".<shard>.<org>"): a record's event id
--          "~<uuid>" is "<uuid><id_tail>" (admit.lua)
--
-- Returns 1 when a decision was voided (its event appended), 0 when another attempt of it
-- may have been answered. Running it twice for one attempt voids nothing more: the event
-- appended again has the same id, which the meter deduplicates.
local outbox = KEYS[1]
local attempt, tag, org, mark_ttl, after_id, after_time, rest, idem, idem_w, legacy, id_tail = unpack(ARGV, 1, 11)
local time = redis.call('TIME')
local voided = attempt
if idem ~= '' then
  local b = math.floor((tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000) / tonumber(idem_w))
  local where, record = tag .. 'i:' .. b, nil
  record = redis.call('HGET', where, idem)
  if not record then where = tag .. 'i:' .. (b - 1); record = redis.call('HGET', where, idem) end
  if not record and legacy ~= '' then where = false; record = redis.call('GET', legacy) end
  if record then
    local head, attempts = string.match(record, '^([^\n]*)\n?(.*)$')
    local id = string.match(head, '^(%S+)')
    if string.sub(id, 1, 1) == '~' then id = string.sub(id, 2) .. id_tail end
    if attempts == '' then attempts = id end
    local others, found = {}, false
    for a in string.gmatch(attempts, '%S+') do
      local full = a -- "~<uuid>" is "<uuid><id_tail>", as in the head
      if string.sub(a, 1, 1) == '~' then full = string.sub(a, 2) .. id_tail end
      if full == attempt and not found then found = true else others[#others + 1] = a end
    end
    if found and #others > 0 then
      record = head .. '\n' .. table.concat(others, ' ')
      if where then redis.call('HSET', where, idem, record) else redis.call('SET', legacy, record, 'KEEPTTL') end
      return 0
    end
    if found then
      voided = id
      if where then redis.call('HDEL', where, idem) else redis.call('DEL', legacy) end
    end
  end
  -- A decision of this request taken after this call (it was still queued) is voided too:
  -- a replay of it decides afresh (admit.lua).
  redis.call('SET', tag .. 'v:' .. voided, '1', 'PX', tonumber(mark_ttl))
end
local leases = tag .. 'l:' .. voided
local held = redis.call('GET', leases)
if held then
  for set in string.gmatch(held, '%S+') do redis.call('ZREM', set, voided) end
  redis.call('DEL', leases)
end
redis.call('XADD', outbox, '*', 'k', org, 'v', '{"specversion":"1.0","id":"' .. voided .. '/void' ..
  after_id .. rfc3339(tonumber(time[1]), tonumber(time[2])) .. after_time .. voided .. rest)
return 1
