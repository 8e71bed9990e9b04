-- Ready, in-flight, delayed and dead counts of one queue, by the server clock.
-- KEYS: ready, delayed, inflight, dead.  Returns {ready, in_flight, delayed, dead}.
-- Delayed messages already due and in-flight ones whose lease expired count as ready:
-- the next claim will hand them out.
local t = now()
local due = redis.call('ZCOUNT', KEYS[2], '-inf', t)
local expired = redis.call('ZCOUNT', KEYS[3], '-inf', t)
return {redis.call('ZCARD', KEYS[1]) + due + expired,
        redis.call('ZCARD', KEYS[3]) - expired,
        redis.call('ZCARD', KEYS[2]) - due,
        redis.call('ZCARD', KEYS[4])}
