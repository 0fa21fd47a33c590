-- mark_read.lua: what the idempotency janitor (internal/outbox, mark.go) needs of one shard to
-- move its mark, read in one snapshot on the shard's node: Redis TIME first, the mark, and
-- the oldest entry of each outbox stream (an entry not produced to Kafka yet is never
-- trimmed: relay_ack.lua). An admission whose script ran before this one has its event in a
-- stream or produced; one that runs after reads a later TIME.
--
-- KEYS[1]   the shard's mark (admission.Keys.IdempotencyMark)
-- KEYS[2..] the shard's outbox streams (admission.Keys.Outboxes)
-- Returns {sec, usec, mark ("" when there is none), per stream its oldest id ("" when
-- empty)}.
local time = redis.call('TIME')
local out = {time[1], time[2], redis.call('GET', KEYS[1]) or ''}
for i = 2, #KEYS do
  local first = redis.call('XRANGE', KEYS[i], '-', '+', 'COUNT', 1)[1]
  out[#out + 1] = first and first[1] or ''
end
return out
