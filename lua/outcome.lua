-- outcome.lua: releases the concurrency leases of an admitted request and appends its
-- outcome event to the outbox.
--
-- KEYS[1]   the shard's outbox stream
-- KEYS[2]   the request's lease record (the lease sets it holds, space-separated)
-- KEYS[3..] the lease sets named by the record, as the caller read it
-- ARGV[1]   org (the Kafka key)
-- ARGV[2]   event id of the admitted request
-- ARGV[3]   the lease record as the caller read it
-- ARGV[4]   event JSON up to the time; ARGV[5] the rest
--
-- A second outcome for the same request releases nothing (the record is gone) and
-- appends a second event, which the meter deduplicates. Returns the number of leases
-- released.
local time = redis.call('TIME')
local released = 0
if #KEYS > 2 and redis.call('GET', KEYS[2]) == ARGV[3] then
  for i = 3, #KEYS do
    released = released + redis.call('ZREM', KEYS[i], ARGV[2])
  end
  redis.call('DEL', KEYS[2])
end
redis.call('XADD', KEYS[1], '*', 'k', ARGV[1], 'v',
  ARGV[4] .. rfc3339(tonumber(time[1]), tonumber(time[2])) .. ARGV[5])
return released
