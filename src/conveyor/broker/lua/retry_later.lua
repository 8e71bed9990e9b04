-- Give a message back, deliverable after a delay, optionally with a new body.
-- KEYS: message, inflight, ready, delayed, wake.
-- ARGV: id, lease token, delay seconds, '1' to replace the body else '0', new body.
-- Returns 1, or 0: lease lost.
if not owns(KEYS[1], ARGV[2]) then return 0 end
local id = ARGV[1]
redis.call('HDEL', KEYS[1], 'lease')
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'body', ARGV[5]) end
redis.call('ZREM', KEYS[2], id)
local delay = tonumber(ARGV[3])
if delay > 0 then
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZADD', KEYS[4], now() + delay, id)
else
  redis.call('ZADD', KEYS[3], rank(id, redis.call('HGET', KEYS[1], 'priority')), id)
end
nudge(KEYS[5])
return 1
