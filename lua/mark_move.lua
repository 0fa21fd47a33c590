-- mark_move.lua: moves a shard's idempotency mark forward, never back, and deletes the hot
-- buckets it passed (internal/outbox, mark.go). The mark is ms since the epoch before which every
-- event of the shard is in the billing log; a mark older than the idempotency TTL says no
-- more than none, so it expires then.
--
-- KEYS[1]   the shard's mark
-- KEYS[2..] hot buckets wholly before both the new mark's bucket and the previous bucket
--           (Go computes them from this mark: a mark already further deletes no fewer)
-- ARGV[1]   the new mark, ms
-- ARGV[2]   the idempotency TTL, ms
-- Returns {the mark now, buckets deleted}.
local want, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local mark = tonumber(redis.call('GET', KEYS[1]))
if not mark or mark < want then
  mark = want
  redis.call('SET', KEYS[1], string.format('%d', mark), 'PXAT', string.format('%d', mark + ttl))
end
local deleted = 0
for i = 2, #KEYS, 256 do
  deleted = deleted + redis.call('DEL', unpack(KEYS, i, math.min(i + 255, #KEYS)))
end
return {mark, deleted}
