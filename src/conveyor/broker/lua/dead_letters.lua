-- The oldest dead letters of one queue.
-- KEYS: dead.  ARGV: message key prefix, limit (> 0).
-- Returns per dead letter: id, dead_at, body, reason, deliveries.
local head = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1, 'WITHSCORES')
local out = {}
for i = 1, #head, 2 do
  local fields = redis.call('HMGET', ARGV[1] .. head[i], 'body', 'reason', 'deliveries')
  if fields[1] then
    out[#out + 1] = head[i]
    out[#out + 1] = head[i + 1]
    out[#out + 1] = fields[1]
    out[#out + 1] = fields[2] or ''
    out[#out + 1] = fields[3] or '0'
  end
end
return out
