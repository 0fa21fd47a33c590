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
--          key); ARGV[9] idem_h: the hot window H, ms; ARGV[10] idem_ttl: the idempotency
--          TTL, ms; ARGV[11] marked: "1" when a billing log answers for old keys (the
--          record is in a hot bucket "<tag>h:<floor(now / H)>" from the shard's mark's
--          on, else in the current one or the one before: admit.lua); ARGV[12]
--          idem_legacy: the bucket width of the layout before hot buckets ("<tag>i:<b>"),
--          ms, "" when not looked up
-- ARGV[13] id_tail: how the org's event ids end (".<shard>.<org>"): a record's event id
--          "~<uuid>" is "<uuid><id_tail>" (admit.lua)
--
-- Returns 1 when a decision was voided (its event appended), 0 when another attempt of it
-- may have been answered. Running it twice for one attempt voids nothing more: the event
-- appended again has the same id, which the meter deduplicates.
local outbox = KEYS[1]
local attempt, tag, org, mark_ttl, after_id, after_time, rest, idem, idem_h, idem_ttl, marked, idem_legacy,
  id_tail = unpack(ARGV, 1, 13)
local time = redis.call('TIME')
local voided = attempt
if idem ~= '' then
  local now = tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000
  idem_h, idem_ttl = tonumber(idem_h), tonumber(idem_ttl)
  local b = math.floor(now / idem_h)
  local lo = b - 1
  if marked == '1' then
    local mark, oldest = tonumber(redis.call('GET', tag .. 'h:mark')), math.floor((now - idem_ttl) / idem_h)
    local m = mark and math.floor(mark / idem_h) or oldest
    if m < oldest then m = oldest end
    if m < lo then lo = m end
  end
  local where, record
  for k = b, lo, -1 do
    where = tag .. 'h:' .. k
    record = redis.call('HGET', where, idem)
    if record then break end
  end
  if not record and idem_legacy ~= '' then
    local lb = math.floor(now / tonumber(idem_legacy))
    for k = lb, lb - 1, -1 do
      where = tag .. 'i:' .. k
      record = redis.call('HGET', where, idem)
      if record then break end
    end
  end
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
      redis.call('HSET', where, idem, record)
      return 0
    end
    if found then
      -- The record stays: with the void mark below it tells admit.lua that the key's
      -- decision was voided, so that a replay decides afresh rather than finding the
      -- voided admission in the billing log before its void (CHECK_LOG).
      voided = id
    end
  end
  -- A decision of this request taken after this call (it was still queued) is voided too:
  -- a replay of it decides afresh (admit.lua).
  redis.call('SET', tag .. 'v:' .. voided, '1', 'PX', tonumber(mark_ttl)) -- keyspace.Keys.VoidMark
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
