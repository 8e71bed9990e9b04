-- Delete up to a batch of messages from each of a queue's sets (in-flight ones too, as on
-- SQLite: their owners' settles then raise LeaseLost).
-- KEYS: ready, delayed, inflight, dead, wake.  ARGV: message key prefix, batch size.
-- Returns {deleted, 1 if a set may hold more (call again) else 0}.
local prefix, batch = ARGV[1], tonumber(ARGV[2])
local deleted, more = 0, 0
for i = 1, 4 do
  local ids = redis.call('ZRANGE', KEYS[i], 0, batch - 1)
  if #ids > 0 then
    local messages = {}
    for j, id in ipairs(ids) do messages[j] = prefix .. id end
    redis.call('DEL', unpack(messages))
    redis.call('ZREM', KEYS[i], unpack(ids))
    deleted = deleted + #ids
    if #ids == batch then more = 1 end
  end
end
redis.call('DEL', KEYS[5])
return {deleted, more}
