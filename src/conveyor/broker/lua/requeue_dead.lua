-- Put dead letters back on their queue with a fresh delivery count (as on SQLite).
-- KEYS: dead, ready, wake.
-- ARGV: message key prefix, batch size, then the ids to requeue (none: the oldest batch).
-- Returns {requeued, ids looked at}; redis.py calls again while a full batch was looked at.
local prefix = ARGV[1]
local ids
if #ARGV > 2 then
  ids = {unpack(ARGV, 3)}
else
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
end
local requeued = 0
for _, id in ipairs(ids) do
  local key = prefix .. id
  local priority = redis.call('HGET', key, 'priority')
  if redis.call('ZREM', KEYS[1], id) == 1 and priority then
    redis.call('HDEL', key, 'reason', 'dead_at', 'lease')
    redis.call('HSET', key, 'deliveries', 0)
    redis.call('ZADD', KEYS[2], rank(id, priority), id)
    requeued = requeued + 1
  end
end
if requeued > 0 then nudge(KEYS[3]) end
return {requeued, #ids}
