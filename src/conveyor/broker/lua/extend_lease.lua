-- Heartbeat: move this delivery's lease deadline to now + seconds.
-- KEYS: message, inflight, ready.  ARGV: id, lease token, seconds.
-- Returns 1, or 0: lease lost.
if not owns(KEYS[1], ARGV[2]) then return 0 end
-- Expired and moved back to ready but not claimed by anyone yet: take it back.
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[2], now() + tonumber(ARGV[3]), ARGV[1])
return 1
