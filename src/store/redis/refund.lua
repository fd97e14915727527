-- Sluice: give back hits a shard consumed for a request that was denied as a whole
-- (by a limit on another shard). Lua for the same reason as decide.lua: read and
-- adjust each counter atomically in one round trip.
--
-- KEYS[i]: the counter. Per hit 4 ARGV values: algorithm code, window, hits, and the
-- refund token decide.lua returned (fixed/sliding counter: the window start charged;
-- log: the entry's timestamp; buckets: the time cost added to tat). Counters that
-- have since expired or moved on are left alone. TTLs are kept.

for i = 1, #KEYS do
  local at = (i - 1) * 4
  local code = ARGV[at + 1]
  local w = tonumber(ARGV[at + 2])
  local hits = tonumber(ARGV[at + 3])
  local token = tonumber(ARGV[at + 4])
  local key = KEYS[i]
  if code == 'sl' then
    local members = redis.call('ZRANGEBYSCORE', key, fmt(token), fmt(token))
    if #members > 0 then
      local left = log_hits(members[1]) - hits
      redis.call('ZREMRANGEBYSCORE', key, fmt(token), fmt(token))
      if left > 0 then redis.call('ZADD', key, fmt(token), log_member(token, left)) end
    end
  else
    local s = redis.call('GET', key)
    if s then
      local st = decode(s, code)
      if code == 'fw' then
        if st[1] == token then st[2] = math.max(st[2] - hits, 0) end
      elseif code == 'sc' then
        if st[1] == token then
          st[3] = math.max(st[3] - hits, 0)
        elseif st[1] == token + w then
          st[2] = math.max(st[2] - hits, 0)
        end
      else
        st[1] = st[1] - token
      end
      redis.call('SET', key, encode(st), 'KEEPTTL')
    end
  end
end
return 1
