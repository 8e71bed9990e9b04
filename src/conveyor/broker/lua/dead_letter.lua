-- Quarantine a message with a reason; only requeue_dead brings it back.
-- KEYS: message, inflight, ready, dead.  ARGV: id, lease token, reason.
-- Returns 1, or 0: lease lost.
if not owns(KEYS[1], ARGV[2]) then return 0 end
local t = now()
redis.call('HDEL', KEYS[1], 'lease')
redis.call('HSET', KEYS[1], 'reason', ARGV[3], 'dead_at', t)
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[4], t, ARGV[1])
return 1
