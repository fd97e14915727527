-- Sluice: what the decide script would answer for these hits now, changing nothing
-- (the admin API's Explain). Nothing is consumed, created or given a new expiry.
--
-- KEYS: the counters of every hit (a key may repeat: the later hit sees the state
-- the earlier one would leave). ARGV[1]: fixed now in microseconds (tests only) or
-- ''. Then per hit 5 values: algorithm code, requests, window, burst, hits.
--
-- Returns per hit: admitted, remaining, reset, retry_after, delay, next_room, and
-- what the key owes before the hit; then the `now` it read at.

local now
if ARGV[1] ~= nil and ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local states, out = {}, {}
for i = 1, #KEYS do
  local a = 1 + (i - 1) * 5
  local code = ARGV[a + 1]
  local decide = algorithm(code)
  if decide == nil then
    return redis.error_reply('sluice: unknown algorithm ' .. tostring(code))
  end
  local r, w, b = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local hits = tonumber(ARGV[a + 5])
  if w < 1 then w = 1 end
  local leaky = code == 'lb'
  local key = KEYS[i]
  local st = states[key]
  if st == nil then
    if code == 'sl' then
      st = load_log(key, now, w)
    else
      local s = redis.call('GET', key)
      if s then st = decode(s, code) end
    end
    states[key] = st or false
  end
  st = st or nil
  local owed = owed_now(code, decide, r, w, b, st, now, leaky)
  local admitted, remaining, reset, retry, delay, nxt = decide(r, w, b, st, now, hits, leaky)
  if nxt ~= nil then
    st = nxt
    states[key] = nxt
  end
  local room = 0
  if hits > 0 and ((admitted == 1 and remaining == 0) or (admitted == 0 and retry == NEVER)) then
    room = (select(4, decide(r, w, b, st, now, 1, leaky)))
  end
  out[#out + 1] = admitted
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
  out[#out + 1] = delay
  out[#out + 1] = room
  out[#out + 1] = owed
end
out[#out + 1] = now
return out
