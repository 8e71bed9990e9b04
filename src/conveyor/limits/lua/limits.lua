-- The Redis limiter: every operation is one call of this script, so each is atomic.
-- ARGV[1] prefix, ARGV[2] operation, ARGV[3] now (Unix seconds), ARGV[4] lease (seconds).
-- KEYS[1] is P:keys, for a cluster client's routing; every name below carries the prefix's
-- hash tag ({limits}), so they all live in KEYS[1]'s slot (redis.py).
-- Keys (all under the prefix P):
--   P:keys         set of every key seen            P:decl   hash key -> declared spec (JSON)
--   P:set:<key>    hash max/per_second/burst set at run time (wins over the declared spec)
--   P:tok:<key>    zset holder -> token expiry      P:w:<key> hash holder -> weight
--   P:park:<key>   zset id -> arrival sequence (the waiting area, oldest first)
--   P:pm / P:pb    hash id -> parked meta (JSON: queue, priority, key, weight) / body
--   P:moving       zset id -> deadline: handed a token, not yet confirmed published
--   P:rate:<key>   GCRA theoretical arrival time    P:denied hash key -> times denied
local P = ARGV[1]
local op = ARGV[2]
local now = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])

local function override(key, field)
  local v = redis.call('HGET', P .. ':set:' .. key, field)
  if v then return tonumber(v) end
  return nil
end

local function max_of(key, declared)
  return override(key, 'max') or declared
end

local function declared_max(key)
  local d = redis.call('HGET', P .. ':decl', key)
  if d then return cjson.decode(d).max or 1 end
  return 1
end

local function purge(key)
  local tk = P .. ':tok:' .. key
  local gone = redis.call('ZRANGEBYSCORE', tk, '-inf', '(' .. now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', tk, '-inf', '(' .. now)
    redis.call('HDEL', P .. ':w:' .. key, unpack(gone))
  end
end

local function used(key)
  local total = 0
  for _, w in ipairs(redis.call('HVALS', P .. ':w:' .. key)) do total = total + tonumber(w) end
  return total
end

local function grant(key, holder, weight)
  redis.call('ZADD', P .. ':tok:' .. key, now + lease, holder)
  redis.call('HSET', P .. ':w:' .. key, holder, weight)
end

local function drop(key, holder)
  redis.call('ZREM', P .. ':tok:' .. key, holder)
  redis.call('HDEL', P .. ':w:' .. key, holder)
end

-- delete `key`'s state when none of it matters: no token (lapsed ones purged first), nobody
-- waiting, no override, and a rate bucket full again (tat <= now: the same as no bucket).
-- Keys made from templates (`tenant:{id}`) would otherwise pile up forever.
local function forget_if_idle(key)
  if redis.call('ZCARD', P .. ':tok:' .. key) > 0 or redis.call('ZCARD', P .. ':park:' .. key) > 0
      or redis.call('EXISTS', P .. ':set:' .. key) == 1
      or tonumber(redis.call('GET', P .. ':rate:' .. key) or '0') > now then
    return
  end
  redis.call('SREM', P .. ':keys', key)
  redis.call('HDEL', P .. ':decl', key)
  redis.call('HDEL', P .. ':denied', key)
  redis.call('DEL', P .. ':w:' .. key, P .. ':rate:' .. key)
end

-- hand free tokens of `key` to its oldest parked messages; append them to `out`
local function unpark(key, out)
  local limit = max_of(key, declared_max(key))
  local u = used(key)
  while true do
    local first = redis.call('ZRANGE', P .. ':park:' .. key, 0, 0)
    if #first == 0 then break end
    local id = first[1]
    local meta = cjson.decode(redis.call('HGET', P .. ':pm', id))
    if u + meta.w > limit then break end
    redis.call('ZREM', P .. ':park:' .. key, id)
    grant(key, id, meta.w)
    u = u + meta.w
    redis.call('ZADD', P .. ':moving', now + lease, id)
    table.insert(out, {id, meta.q, tostring(meta.p), redis.call('HGET', P .. ':pb', id)})
  end
end

local function flatten(parcels)
  local flat = {}
  for _, p in ipairs(parcels) do
    for _, v in ipairs(p) do table.insert(flat, v) end
  end
  return flat
end

-- declare `specs`; the first concurrency key with no room for `holder` and its weight
local function full_of(specs, holder)
  local full, full_weight = nil, 1
  for _, s in ipairs(specs) do
    redis.call('SADD', P .. ':keys', s.key)
    redis.call('HSET', P .. ':decl', s.key, cjson.encode(s))
    if s.k == 'c' then
      purge(s.key)
      if not redis.call('ZSCORE', P .. ':tok:' .. s.key, holder) and full == nil
          and used(s.key) + s.w > max_of(s.key, s.max) then
        full, full_weight = s.key, s.w
      end
    end
  end
  return full, full_weight
end

-- put `holder` in the waiting area of `full` (once per id), holding nothing anywhere
local function park(specs, holder, queue, body, priority, full, full_weight)
  for _, s in ipairs(specs) do
    if s.k == 'c' then drop(s.key, holder) end
  end
  redis.call('ZREM', P .. ':moving', holder)
  if redis.call('ZSCORE', P .. ':park:' .. full, holder) == false then
    redis.call('ZADD', P .. ':park:' .. full, redis.call('INCR', P .. ':seq'), holder)
    redis.call('HSET', P .. ':pm', holder,
               cjson.encode({q = queue, p = tonumber(priority), k = full, w = full_weight}))
    redis.call('HSET', P .. ':pb', holder, body)
  end
  redis.call('HINCRBY', P .. ':denied', full, 1)
end

if op == 'park_many' then
  -- ARGV[5..]: per message specs, holder, queue, body, priority; returns the key each was
  -- parked on ('' where there was room)
  local out = {}
  for i = 5, #ARGV, 5 do
    local specs, holder = cjson.decode(ARGV[i]), ARGV[i + 1]
    local full, full_weight = full_of(specs, holder)
    if full then
      park(specs, holder, ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], full, full_weight)
    end
    table.insert(out, full or '')
  end
  return out
end

if op == 'admit' then
  local specs = cjson.decode(ARGV[5])
  local holder, queue, body, priority = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
  local reserved, slack = ARGV[10] == '1', tonumber(ARGV[11])
  local full, full_weight = full_of(specs, holder)
  if full then
    park(specs, holder, queue, body, priority, full, full_weight)
    return {'parked', full, '0'}
  end
  if not reserved then
    local delay, late = 0, {}
    for _, s in ipairs(specs) do
      if s.k == 'r' then
        local ps = override(s.key, 'per_second') or s.ps
        local burst = override(s.key, 'burst') or s.b
        local interval = 1.0 / ps
        local tat = tonumber(redis.call('GET', P .. ':rate:' .. s.key) or '0')
        local start = math.max(now, tat - (burst - 1) * interval)
        local next_tat = math.max(tat, now) + interval
        redis.call('SET', P .. ':rate:' .. s.key, tostring(next_tat),
                   'PX', math.ceil((next_tat - now) * 1000) + 1000)
        if start - now > slack then table.insert(late, s.key) end
        delay = math.max(delay, start - now)
      end
    end
    if delay > slack then
      for _, key in ipairs(late) do redis.call('HINCRBY', P .. ':denied', key, 1) end
      return {'delayed', '', tostring(delay)}
    end
  end
  for _, s in ipairs(specs) do
    if s.k == 'c' then
      grant(s.key, holder, s.w)
      if redis.call('ZREM', P .. ':park:' .. s.key, holder) == 1 then
        redis.call('HDEL', P .. ':pm', holder)
        redis.call('HDEL', P .. ':pb', holder)
      end
    end
  end
  return {'run', '', '0'}
end

if op == 'release' then
  local holder, out = ARGV[5], {}
  for i = 6, #ARGV do
    drop(ARGV[i], holder)
    purge(ARGV[i])
    unpark(ARGV[i], out)
    forget_if_idle(ARGV[i])
  end
  return flatten(out)
end

if op == 'renew' then
  for i = 5, #ARGV, 2 do
    redis.call('ZADD', P .. ':tok:' .. ARGV[i], 'XX', now + lease, ARGV[i + 1])
  end
  return 0
end

if op == 'sweep' then
  local out = {}
  for _, key in ipairs(redis.call('SMEMBERS', P .. ':keys')) do
    purge(key)
    unpark(key, out)
    forget_if_idle(key)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. ':moving', '-inf', '(' .. now)) do
    local meta = cjson.decode(redis.call('HGET', P .. ':pm', id))
    redis.call('ZADD', P .. ':moving', now + lease, id)
    redis.call('ZADD', P .. ':tok:' .. meta.k, 'XX', now + lease, id)
    table.insert(out, {id, meta.q, tostring(meta.p), redis.call('HGET', P .. ':pb', id)})
  end
  return flatten(out)
end

if op == 'moved' then
  for i = 5, #ARGV do
    if redis.call('ZREM', P .. ':moving', ARGV[i]) == 1 then
      redis.call('HDEL', P .. ':pm', ARGV[i])
      redis.call('HDEL', P .. ':pb', ARGV[i])
    end
  end
  return 0
end

return redis.error_reply('unknown limiter operation ' .. tostring(op))
