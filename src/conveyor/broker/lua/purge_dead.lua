-- Delete dead letters of one queue for good.
-- KEYS: dead.
-- ARGV: message key prefix, batch size, then the ids to delete (none: the oldest batch).
-- Returns {deleted, ids looked at}; redis.py calls again while a full batch was looked at.
local prefix = ARGV[1]
local ids
if #ARGV > 2 then
  ids = {unpack(ARGV, 3)}
else
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
end
local deleted = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('DEL', prefix .. id)
    deleted = deleted + 1
  end
end
return {deleted, #ids}
