-- Sluice: penalty sentences shared by every replica (bans, tightenings, the block
-- list), on one shard (one cluster slot: every key carries the {sluice-board} tag).
--
-- KEYS[1]: the list, a sorted set of counter keys scored by when their sentence
-- ends (microseconds). KEYS[2]: a hash, counter key -> "kind factor_ppm info".
-- KEYS[3], KEYS[4] (strike, pardon): the key's denial count ("start prev cur", the
-- sliding-window estimate the limiter uses in process) and its sentence count
-- ("start n") for `block`.
-- ARGV[1]: the operation; ARGV[2]: fixed now in microseconds (tests) or ''.
--
-- strike ARGV[3..]: key, violations, within, kind (b/t), span, factor_ppm, bans (0:
--   no block), block within, block span, info, denials (absent: 1, as older
--   replicas send). Returns {} or {kind, remaining, factor_ppm, info, started 0/1}.
-- put ARGV[3..]: key, kind, span, factor_ppm, info. Returns 1.
-- pardon ARGV[3]: key. Returns 1 when a sentence was in force.
-- list: returns {now, key, until, record, key, until, record, ...}.

local MAX = 10000  -- sentences kept; past it the soonest to end are dropped

local list, infos = KEYS[1], KEYS[2]
local op = ARGV[1]
local now
if ARGV[2] ~= nil and ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function fmt(n) return string.format('%d', n) end
local function ms(us)
  local m = math.ceil(us / 1000)
  if m < 1 then m = 1 end
  return fmt(m)
end

-- Drops sentences that have ended (a bounded number per call).
local function prune()
  local ended = redis.call('ZRANGEBYSCORE', list, '-inf', fmt(now), 'LIMIT', 0, 100)
  for _, k in ipairs(ended) do
    redis.call('ZREM', list, k)
    redis.call('HDEL', infos, k)
  end
end

local function put(key, kind, untl, ppm, info)
  redis.call('ZADD', list, fmt(untl), key)
  redis.call('HSET', infos, key, kind .. ' ' .. ppm .. ' ' .. info)
  local n = redis.call('ZCARD', list)
  if n > MAX then
    local gone = redis.call('ZPOPMIN', list, n - MAX)
    for i = 1, #gone, 2 do redis.call('HDEL', infos, gone[i]) end
  end
end

prune()

if op == 'list' then
  local out = { now }
  local members = redis.call('ZRANGE', list, 0, -1, 'WITHSCORES')
  for i = 1, #members, 2 do
    local rec = redis.call('HGET', infos, members[i])
    if rec then
      out[#out + 1] = members[i]
      out[#out + 1] = tonumber(members[i + 1])
      out[#out + 1] = rec
    end
  end
  return out
end

local key = ARGV[3]

if op == 'put' then
  put(key, ARGV[4], now + tonumber(ARGV[5]), ARGV[6], ARGV[7])
  return 1
end

if op == 'pardon' then
  local untl = redis.call('ZSCORE', list, key)
  redis.call('ZREM', list, key)
  redis.call('HDEL', infos, key)
  redis.call('DEL', KEYS[3], KEYS[4])
  if untl and tonumber(untl) > now then return 1 end
  return 0
end

if op ~= 'strike' then
  return redis.error_reply('sluice: unknown board operation ' .. tostring(op))
end

-- A key already denied outright (by another replica, or an operator) is told so.
local untl = redis.call('ZSCORE', list, key)
if untl and tonumber(untl) > now then
  local rec = redis.call('HGET', infos, key)
  if rec and string.sub(rec, 1, 1) ~= 't' then
    local kind, ppm, info = string.match(rec, '^(%S+) (%d+) (.*)$')
    return { kind, tonumber(untl) - now, tonumber(ppm), info, 0 }
  end
end

local violations, within = tonumber(ARGV[4]), tonumber(ARGV[5])
local start, prev, cur = now, 0, 0
local s = redis.call('GET', KEYS[3])
if s then
  local a, b, c = string.match(s, '^(%d+) (%d+) (%d+)$')
  if a then start, prev, cur = tonumber(a), tonumber(b), tonumber(c) end
end
if now >= start + within then
  local spans = math.floor((now - start) / within)
  if spans == 1 then prev = cur else prev = 0 end
  cur = 0
  start = start + spans * within
end
cur = cur + (tonumber(ARGV[13]) or 1)
local left = within - (now - start)
local estimate = math.floor(prev * left / within) + cur
if estimate < violations then
  redis.call('PSETEX', KEYS[3], ms(start + 2 * within - now), fmt(start) .. ' ' .. prev .. ' ' .. cur)
  return {}
end
redis.call('DEL', KEYS[3])

local kind, span, ppm = ARGV[6], tonumber(ARGV[7]), ARGV[8]
local bans = tonumber(ARGV[9])
if bans > 0 then
  local bwithin = tonumber(ARGV[10])
  local pstart, n = now, 0
  local p = redis.call('GET', KEYS[4])
  if p then
    local a, b = string.match(p, '^(%d+) (%d+)$')
    if a then pstart, n = tonumber(a), tonumber(b) end
  end
  if now >= pstart + bwithin then pstart, n = now, 0 end
  n = n + 1
  if n >= bans then
    kind, span = 'k', tonumber(ARGV[11])
    redis.call('DEL', KEYS[4])
  else
    redis.call('PSETEX', KEYS[4], ms(pstart + bwithin - now), fmt(pstart) .. ' ' .. n)
  end
end
put(key, kind, now + span, ppm, ARGV[12])
return { kind, span, tonumber(ppm), ARGV[12], 1 }
