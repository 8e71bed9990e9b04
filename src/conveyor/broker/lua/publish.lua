-- Store one message and wake a consumer.
-- KEYS: ready, delayed, wake, id counter.  ARGV: message key prefix, queue, body, priority,
-- delay in seconds (0: ready now).  Returns the new message id.
local id = tostring(redis.call('INCR', KEYS[4]))
redis.call('HSET', ARGV[1] .. id, 'queue', ARGV[2], 'body', ARGV[3], 'priority', ARGV[4],
           'deliveries', 0)
local delay = tonumber(ARGV[5])
if delay > 0 then
  redis.call('ZADD', KEYS[2], now() + delay, id)
else
  redis.call('ZADD', KEYS[1], rank(id, ARGV[4]), id)
end
-- A delayed message wakes consumers too: they re-arm their BLPOP timeout to its due time.
nudge(KEYS[3])
return id
