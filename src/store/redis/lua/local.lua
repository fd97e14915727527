-- Sluice: a replica's heartbeat, for `failure_mode: local`'s share of each limit.
-- KEYS[1]: the sorted set of replicas, scored by each one's latest beat.
-- ARGV[1]: this replica's member (its id, and `@` and its address when it has
-- one); ARGV[2]: how long a beat counts as live, and ARGV[3] how long it is held
-- after that (the replica is missing), in milliseconds.
-- Returns {live, missing, member, beat, member, beat, ...}: the counts of replicas
-- that beat within the live span (this one included) and of those whose latest
-- beat is older but within the hold, then each live member with its latest beat.
-- Time is Redis's own, so replicas' clocks never meet.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = tonumber(ARGV[2])
local hold = math.max(tonumber(ARGV[3]), live)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - hold)
redis.call('PEXPIRE', KEYS[1], hold)
local all = redis.call('ZCARD', KEYS[1])
local members = redis.call('ZRANGEBYSCORE', KEYS[1], now - live, '+inf', 'WITHSCORES')
local fresh = #members / 2
local out = {fresh, all - fresh}
for i = 1, #members, 2 do
  out[#out + 1] = members[i]
  out[#out + 1] = tonumber(members[i + 1])
end
return out
