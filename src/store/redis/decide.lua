-- Sluice: decide one request's hits on this shard, atomically.
--
-- Why Lua and not MULTI/EXEC: the decision is check-then-consume across several keys
-- (consume only if every limit admits), which MULTI/EXEC cannot express without
-- WATCH and retries under contention; a script runs atomically in one round trip,
-- and reads the clock (TIME) on the server, so every sluice replica decides with the
-- same clock.
--
-- KEYS[i]: the counter of hit i (a key may repeat: the later hit sees the earlier
-- one's state). ARGV[1]: fixed now in microseconds (tests only) or ''. ARGV[2]: '1'
-- when quota-mode hits of this request live on other shards (so an all-denied quota
-- here does not deny on its own). Then per hit 6 values: algorithm code, requests,
-- window, burst, hits, mode ('e' enforce, 's' shadow, 'q' quota).
--
-- Returns {consumed 0/1, then per hit: admitted, remaining, reset, retry_after,
-- delay, refund token, next_room}. next_room: after an admission that leaves no room
-- (remaining 0, hits > 0), the retry_after of a one-hit request on the new state (so
-- the caller can cache the denial it implies); 0 otherwise.

local now = clock(ARGV[1])
local quota_elsewhere = ARGV[2] == '1'

local states = {}   -- key -> state as the next hit sees it
local seen = {}     -- key -> true once loaded
local changed = {}  -- keys with a state to write, in first-change order
local change = {}   -- key -> {alg, limit, dirty log timestamps}
local out = { 0 }
local enforce_denied, quota_seen, quota_ok = false, false, false

local function load(alg, key, w)
  if alg.log then
    -- Only entries still in the window: t + w > now.
    local raw = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - w), '+inf')
    local entries = {}
    for i = 1, #raw do
      entries[i] = { tonumber(string.match(raw[i], '^(%d+):')), log_hits(raw[i]) }
    end
    if #entries == 0 then return nil end
    return entries
  end
  local s = redis.call('GET', key)
  if not s then return nil end
  return decode(s)
end

for i = 1, #KEYS do
  local at = 2 + (i - 1) * 6
  local alg = ALGORITHMS[ARGV[at + 1]]
  if alg == nil then return redis.error_reply('sluice: unknown algorithm ' .. ARGV[at + 1]) end
  local w = tonumber(ARGV[at + 3])
  if w < 1 then w = 1 end
  local l = { r = tonumber(ARGV[at + 2]), w = w, b = tonumber(ARGV[at + 4]) }
  local hits = tonumber(ARGV[at + 5])
  local mode = ARGV[at + 6]
  local key = KEYS[i]
  if not seen[key] then
    states[key] = load(alg, key, w)
    seen[key] = true
  end
  local v, nxt, token = alg.decide(l, states[key], now, hits)
  if nxt ~= nil then
    states[key] = nxt
    local c = change[key]
    if c == nil then
      c = { alg = alg, dirty = {} }
      change[key] = c
      changed[#changed + 1] = key
    end
    c.limit = l
    if alg.log then c.dirty[token] = true end
  end
  local admitted = v[1] == 1
  if mode == 'e' and not admitted then enforce_denied = true end
  if mode == 'q' then
    quota_seen = true
    if admitted then quota_ok = true end
  end
  for j = 1, 5 do out[#out + 1] = v[j] end
  out[#out + 1] = token
  local room = 0
  if admitted and v[2] == 0 and hits > 0 then
    -- Mirrors algorithm::decide; only when the key is full, so rarely paid.
    room = alg.decide(l, states[key], now, 1)[4]
  end
  out[#out + 1] = room
end

-- The shared admitted() rule of src/store/mod.rs.
if enforce_denied or (quota_seen and not quota_ok and not quota_elsewhere) then
  return out
end

for _, key in ipairs(changed) do
  local c = change[key]
  local st = states[key]
  local expires = c.alg.expires(c.limit, st)
  if c.alg.log then
    for _, e in ipairs(st) do
      if c.dirty[e[1]] then
        redis.call('ZREMRANGEBYSCORE', key, fmt(e[1]), fmt(e[1]))
        redis.call('ZADD', key, fmt(e[1]), log_member(e[1], e[2]))
      end
    end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - c.limit.w))
    redis.call('PEXPIRE', key, ttl_ms(expires, now))
  else
    redis.call('SET', key, encode(st), 'PX', ttl_ms(expires, now))
  end
end
out[1] = 1
return out
