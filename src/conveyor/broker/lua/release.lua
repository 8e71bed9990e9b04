-- Give back every unsettled delivery a closing consumer holds, so they are redelivered now
-- rather than when their leases expire. Keys are built here from the prefix because the
-- deliveries may span queues (one round trip at close).
-- ARGV: key prefix (P), then per delivery: queue, id, lease token.
-- Returns how many were still ours and went back to ready.
local prefix = ARGV[1]
local released = 0
for i = 2, #ARGV, 3 do
  local queue, id, token = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local key = prefix .. ':m:' .. id
  local base = prefix .. ':q:' .. queue .. ':'
  if owns(key, token) then
    redis.call('HDEL', key, 'lease')
    redis.call('ZREM', base .. 'inflight', id)
    redis.call('ZADD', base .. 'ready', rank(id, redis.call('HGET', key, 'priority')), id)
    nudge(base .. 'wake')
    released = released + 1
  end
end
return released
