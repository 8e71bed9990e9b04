-- Helpers shared by every Conveyor script: redis.py prepends this file to each one, so
-- the ready-set order, the clock and the wake-up rule are written down exactly once.
--
-- Key layout (P = the URL's prefix, Q = a queue name):
--   P:ids            INCR counter: message ids, which are also the FIFO sequence
--   P:m:<id>         hash: queue, body, priority, deliveries, lease (token of the owner),
--                    reason and dead_at once dead-lettered
--   P:q:Q:ready      zset, score rank(id, priority): claimable now
--   P:q:Q:delayed    zset, score = due time (server clock, seconds)
--   P:q:Q:inflight   zset, score = lease deadline (server clock, seconds)
--   P:q:Q:dead       zset, score = dead time
--   P:q:Q:wake       list of wake tokens that blocked consumers BLPOP
-- A message id is in exactly one of the four zsets of its queue.

-- 2^40: ids stay below it and priorities within +-8191, so every rank is an exact double.
local RANK_STRIDE = 1099511627776
-- Wake tokens kept per queue: enough for every consumer racing into BLPOP at once, and a
-- bound so a queue nobody consumes cannot grow its list forever.
local WAKE_KEEP = 128

-- Server time in seconds: one clock for every client, however skewed their own clocks are.
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Ready-set score: ZPOPMIN takes the lowest, i.e. highest priority first, then oldest id.
local function rank(id, priority)
  return tonumber(id) - tonumber(priority) * RANK_STRIDE
end

-- Tell blocked consumers there may be work (or a nearer due time) on this queue. A token
-- matters only for the instant between a consumer's empty claim and its BLPOP, so the list
-- also expires: a queue nobody consumes any more leaves nothing behind.
local function nudge(wake)
  redis.call('LPUSH', wake, '1')
  redis.call('LTRIM', wake, 0, WAKE_KEEP - 1)
  redis.call('EXPIRE', wake, 60)
end

-- The lease token check every settle starts with: 0 tells redis.py to raise LeaseLost.
local function owns(message, token)
  return redis.call('HGET', message, 'lease') == token
end

-- ---------------------------------------------------------------------------------------
