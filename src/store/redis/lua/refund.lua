-- Sluice: give back hits a shard consumed for a request that was denied as a whole
-- (by a limit on another shard). Lua for the same reason as decide.lua: read and
-- adjust each counter atomically in one round trip.
--
-- KEYS[i]: the counter. Per hit 5 ARGV values: algorithm code, requests, window,
-- hits, and the refund token decide.lua returned (fixed/sliding counter: the window
-- start charged; log: the entry's timestamp; buckets: none, their cost is hits *
-- window / requests exactly, taken off the exact tat). Counters that have since
-- expired or moved on are left alone. TTLs are kept.

for i = 1, #KEYS do
  local at = (i - 1) * 5
  local code = ARGV[at + 1]
  local r = tonumber(ARGV[at + 2])
  local w = tonumber(ARGV[at + 3])
  local hits = tonumber(ARGV[at + 4])
  local token = tonumber(ARGV[at + 5])
  local key = KEYS[i]
  if code == 'sl' then
    local members = redis.call('ZRANGEBYSCORE', key, fmt(token), fmt(token))
    if #members > 0 then
      local e = log_entry(members[1])
      local back = math.min(hits, e[3])
      redis.call('ZREM', key, members[1])
      if e[3] > back then redis.call('ZADD', key, fmt(token), log_member(token, e[2], e[3] - back)) end
      if e[2] ~= nil then
        -- The newer entries counted these hits before them: no longer. (Those
        -- numbered afresh after the log had emptied never did.)
        for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. fmt(token), '+inf')) do
          local n = log_entry(m)
          if n[2] ~= nil and n[2] >= e[2] + e[3] then
            redis.call('ZREM', key, m)
            redis.call('ZADD', key, fmt(n[1]), log_member(n[1], n[2] - back, n[3]))
          end
        end
      end
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
      elseif r > 0 then
        -- tat - rem / r less cq + cs / r (see gcra in algorithms.lua), at the rate
        -- the state counts in: another replica may have written it under a changed
        -- policy since.
        if st[4] ~= nil and st[3] > 0 and st[4] > 0 then r, w = st[3], st[4] end
        local cq, cs = muldiv(hits, w, r)
        local rem = st[2]
        if rem == nil or rem >= r then rem = 0 end
        rem = rem + cs
        st[1] = st[1] - cq
        if rem >= r then st[1], rem = st[1] - 1, rem - r end
        if rem > 0 or st[4] ~= nil then st[2] = rem else st[2] = nil end
      end
      redis.call('SET', key, encode(st), 'KEEPTTL')
    end
  end
end
return 1
