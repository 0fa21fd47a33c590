-- queue_leave.lua: takes a waiting request out of its limit's queue (its wait ran out or
-- its caller hung up: admit.lua) and, if it was there, tells the queue's channel so that
-- the next waiter may go.
--
-- KEYS[1]  the queue (a sorted set, see admit.lua "Queues")
-- ARGV[1]  the member to remove; ARGV[2] the channel
--
-- Reply: 1 when the member was in the queue, else 0.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('PUBLISH', ARGV[2], KEYS[1])
  return 1
end
return 0
