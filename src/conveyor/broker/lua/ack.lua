-- Remove a message for good.
-- KEYS: message, inflight, ready.  ARGV: id, lease token.  Returns 1, or 0: lease lost.
if not owns(KEYS[1], ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
-- An expired lease may have been moved back to ready without being claimed again yet: the
-- token still matches, nobody else has it, so the owner may still settle it (as on SQLite).
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
