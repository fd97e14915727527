-- RLQS demand of one quota bucket, shared by every Sluice replica's streams.
-- KEYS[1]: the bucket's hash, one field per stream: "demand expiry_ms".
-- ARGV[1]: this stream's id; ARGV[2]: its demand (requests per second, decimal);
-- ARGV[3]: how long its record lives, in milliseconds.
-- Writes this stream's record, drops expired ones, and returns the sum of the live
-- demands (as a string: Redis would cut a Lua number to an integer) and their count.
-- Time is Redis's own, so replicas' clocks never meet.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. (now + ttl))
local all = redis.call('HGETALL', KEYS[1])
local total, n = 0, 0
for i = 1, #all, 2 do
  local d, exp = string.match(all[i + 1], '^(%S+) (%d+)$')
  if exp == nil or tonumber(exp) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    total = total + (tonumber(d) or 0)
    n = n + 1
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
return {string.format('%.6f', total), n}
