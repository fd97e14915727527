-- Sluice: a replica's heartbeat, for `failure_mode: local`'s share of each limit.
-- KEYS[1]: the sorted set of serving replicas, scored by when each stops counting.
-- ARGV[1]: this replica's id; ARGV[2]: how long it counts, in milliseconds.
-- Returns the replicas that count now (this one included). Time is Redis's own, so
-- replicas' clocks never meet.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
