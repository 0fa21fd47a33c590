-- outcome.lua: releases the concurrency leases of an admitted request and appends its
-- outcome event to the outbox.
--
-- KEYS[1]   outbox: the shard's outbox stream
-- KEYS[2]   record: the request's lease record (the lease sets it holds, space-separated)
-- KEYS[3..] the lease sets named by the record, as the caller read it
-- ARGV[1]   org (the Kafka key)
-- ARGV[2]   event_id of the admitted request
-- ARGV[3]   held: the lease record as the caller read it
-- ARGV[4]   head: event JSON up to the time; ARGV[5] tail: the rest
--
-- A second outcome for the same request releases nothing (the record is gone) and
-- appends a second event, which the meter deduplicates. Returns the number of leases
-- released.
local outbox, record = KEYS[1], KEYS[2]
local org, event_id, held, head, tail = unpack(ARGV, 1, 5)
local time = redis.call('TIME')
local released = 0
if #KEYS > 2 and redis.call('GET', record) == held then
  for i = 3, #KEYS do
    released = released + redis.call('ZREM', KEYS[i], event_id)
  end
  redis.call('DEL', record)
end
redis.call('XADD', outbox, '*', 'k', org, 'v',
  head .. rfc3339(tonumber(time[1]), tonumber(time[2])) .. tail)
return released
