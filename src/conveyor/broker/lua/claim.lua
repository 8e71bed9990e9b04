-- Claim up to `limit` messages from several queues, first listed first.
-- KEYS: per queue, in order: ready, delayed, inflight, wake.
-- ARGV: message key prefix, limit, lease seconds, lease token.
-- Returns {ms until the next delayed message or lease falls due in the queues looked at
-- (-1: none known), one string with a line "id queue-index deliveries priority" per claimed
-- message, then their bodies in the same order}. Few reply elements keep parsing cheap.
--
-- This is also the rescuer: due delayed messages and messages whose lease has expired are
-- moved back to ready first. There is no global visibility window; each lease has its own
-- deadline, which extend_lease moves.
local prefix, limit, token = ARGV[1], tonumber(ARGV[2]), ARGV[4]
local t = now()
local deadline = t + tonumber(ARGV[3])
-- Bound the work of one call; the next claim promotes the rest.
local PROMOTE_BATCH = 1000

local function promote(from, ready)
  local ids = redis.call('ZRANGEBYSCORE', from, '-inf', t, 'LIMIT', 0, PROMOTE_BATCH)
  if #ids == 0 then return end
  for _, id in ipairs(ids) do
    local priority = redis.call('HGET', prefix .. id, 'priority')
    if priority then redis.call('ZADD', ready, rank(id, priority), id) end
  end
  redis.call('ZREM', from, unpack(ids))
end

local function take(ready, inflight, index, heads, bodies, want)
  local popped = redis.call('ZPOPMIN', ready, want)
  local got = 0
  for i = 1, #popped, 2 do
    local id = popped[i]
    local key = prefix .. id
    local fields = redis.call('HMGET', key, 'body', 'priority')
    if fields[1] then
      local deliveries = redis.call('HINCRBY', key, 'deliveries', 1)
      redis.call('HSET', key, 'lease', token)
      redis.call('ZADD', inflight, deadline, id)
      heads[#heads + 1] = id .. ' ' .. index .. ' ' .. deliveries .. ' ' .. fields[2]
      bodies[#bodies + 1] = fields[1]
      got = got + 1
    end
  end
  return got
end

local function earliest(due, key)
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local score = head[2] and tonumber(head[2])
  if score and (due == nil or score < due) then return score end
  return due
end

local heads, bodies, got, due = {}, {}, 0, nil
for base = 1, #KEYS, 4 do
  local ready, delayed, inflight, wake = KEYS[base], KEYS[base + 1], KEYS[base + 2],
                                         KEYS[base + 3]
  promote(delayed, ready)
  promote(inflight, ready)
  got = got + take(ready, inflight, (base - 1) / 4, heads, bodies, limit - got)
  if got >= limit then break end
  -- Drained: every wake token left predates this claim and is stale; dropping them keeps
  -- consumers from waking for work that is gone. A later publish pushes a fresh one.
  redis.call('DEL', wake)
  due = earliest(earliest(due, delayed), inflight)
end
local due_ms = -1
if got < limit and due then due_ms = math.max(1, math.ceil((due - t) * 1000)) end
return {due_ms, table.concat(heads, '\n'), unpack(bodies)}
