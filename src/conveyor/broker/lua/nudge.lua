-- Wake one consumer blocked in BLPOP on its private key (Broker.wakeup, from any thread).
-- KEYS: the consumer's private wake key.  The key expires so a dead consumer leaves nothing.
redis.call('LPUSH', KEYS[1], '1')
redis.call('LTRIM', KEYS[1], 0, 0)
redis.call('EXPIRE', KEYS[1], 60)
return 1
