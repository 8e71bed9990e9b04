-- The bodies of the first messages ready on a queue, in delivery order, claiming nothing
-- (the autoscaler reads which limits they carry).
-- KEYS: ready. ARGV: message key prefix, limit.
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)) do
  local body = redis.call('HGET', ARGV[1] .. id, 'body')
  if body then out[#out + 1] = body end
end
return out
