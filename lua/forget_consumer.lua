-- forget_consumer.lua: deletes a consumer of a stream's group, only if it holds no pending
-- entry. The check and the delete are one step, so an entry the consumer reads cannot be
-- orphaned between them (a deleted consumer's pending entries could never be claimed).
--
-- KEYS[1]  the stream
-- ARGV[1]  the group
-- ARGV[2]  the consumer
--
-- Reply: 1 if the consumer was deleted, 0 if it holds pending entries (kept).
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending > 0 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
