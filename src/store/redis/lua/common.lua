-- Sluice: helpers shared by decide.lua and refund.lua (prepended to both).
--
-- Redis Lua numbers are IEEE doubles: integers are exact up to 2^53. Times are
-- microseconds since the epoch (~2^50.6 today), so sums of times and windows stay
-- exact, but products such as requests * window may not. Every product below goes
-- through muldiv, which never forms an inexact intermediate. The Rust side clamps
-- requests, burst, hits and window to at most 2^50 (see scripts.rs).

local NEVER = -1          -- retry_after "never" (u64::MAX on the Rust side)
local HUGE = 2 ^ 53       -- first integer a double cannot count past

-- a - b * floor(a / b) and floor(a / b), exact for 0 <= a < 2^53, 0 < b.
-- (Lua's % divides in floating point, which can round the quotient up by one.)
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  while r < 0 do q = q - 1; r = r + b end
  while r >= b do q = q + 1; r = r - b end
  return q, r
end

-- floor(a * b / c) and (a * b) mod c for integers 0 <= a, b < 2^53 and
-- 0 < c <= 2^52. Returns HUGE when the quotient is 2^53 or more.
local function muldiv(a, b, c)
  local p = a * b
  if p < HUGE then
    -- The product is exact (rounding is monotonic and 2^53 is representable).
    return idiv(p, c)
  end
  -- a * b = a * bq * c + a * br with b = bq * c + br.
  local bq, br = idiv(b, c)
  local q = a * bq
  if q >= HUGE then return HUGE, 0 end
  -- floor(a * br / c) by doubling through the bits of a: the running remainder
  -- stays below c, so 2 * remainder < 2^53 is exact.
  local bits, x = {}, a
  while x > 0 do
    local bit = x % 2
    bits[#bits + 1] = bit
    x = (x - bit) / 2
  end
  local hq, hr = 0, 0
  for i = #bits, 1, -1 do
    hq = hq * 2; hr = hr * 2
    if hr >= c then hq = hq + 1; hr = hr - c end
    if bits[i] == 1 then
      hr = hr + br
      if hr >= c then hq = hq + 1; hr = hr - c end
    end
  end
  q = q + hq
  if q >= HUGE then return HUGE, 0 end
  return q, hr
end

-- ceil(a * b / c), HUGE when too large.
local function muldiv_ceil(a, b, c)
  local q, r = muldiv(a, b, c)
  if q >= HUGE then return HUGE end
  if r > 0 then return q + 1 end
  return q
end

-- Integers as decimal strings: tostring() would print 1.7e+15.
local function fmt(n)
  return string.format('%d', n)
end

-- Milliseconds until `at` (microseconds), rounded up and at least 1, for PEXPIRE.
local function ttl_ms(at, now)
  local ms = math.ceil((at - now) / 1000)
  if ms < 1 then ms = 1 end
  return string.format('%d', ms)
end

-- Non-log states are stored as space-separated integers ("window_start count"),
-- decoded with one fixed pattern per algorithm code (its state's shape) and encoded
-- with one format: gmatch and a format per field cost more, on every hit. Chains of
-- ifs, not tables of patterns: a table constructor would run on every call.
local function decode(s, code)
  local a, b, c, d
  if code == 'sc' then
    a, b, c = string.match(s, '^(%d+) (%d+) (%d+)$')
  elseif code == 'fw' then
    a, b = string.match(s, '^(%d+) (%d+)$')
  elseif code == 'tb' or code == 'lb' then
    -- "tat rem requests window"; an older sluice wrote "tat rem" or "tat" alone
    -- (rem 0), with no rate: read as the limit's.
    a, b, c, d = string.match(s, '^(%d+) (%d+) (%d+) (%d+)$')
    if a == nil then a, b = string.match(s, '^(%d+) ?(%d*)$') end
  end
  if d ~= nil then return { tonumber(a), tonumber(b), tonumber(c), tonumber(d) } end
  if c ~= nil then return { tonumber(a), tonumber(b), tonumber(c) } end
  if b ~= nil then return { tonumber(a), tonumber(b) } end
  if a ~= nil then return { tonumber(a) } end
  -- Not the expected shape: read whatever integers are there.
  local out = {}
  for part in string.gmatch(s, '%S+') do out[#out + 1] = tonumber(part) end
  return out
end

local function encode(st)
  local k = #st
  if k == 4 then return string.format('%d %d %d %d', st[1], st[2], st[3], st[4]) end
  if k == 3 then return string.format('%d %d %d', st[1], st[2], st[3]) end
  if k == 2 then return string.format('%d %d', st[1], st[2]) end
  if k == 1 then return string.format('%d', st[1]) end
  local parts = {}
  for i = 1, k do parts[i] = fmt(st[i]) end
  return table.concat(parts, ' ')
end

-- sliding_window_log members are "timestamp:before:hits" scored by timestamp, where
-- `before` is the sum of the hits of every entry the log held before this one (so
-- the live hits are last.before + last.hits - first.before, read from two members
-- instead of all of them). Members written before `before` existed are
-- "timestamp:hits"; both forms end with the hits, which is all older scripts read.
local function log_member(t, before, h)
  if before == nil then return string.format('%d:%d', t, h) end
  return string.format('%d:%d:%d', t, before, h)
end

-- A member as {t, before (nil in the old form), h, member}.
local function log_entry(member)
  local t, before, h = string.match(member, '^(%d+):(%d+):(%d+)$')
  if t == nil then
    t, h = string.match(member, '^(%d+):(%d+)$')
    return { tonumber(t), nil, tonumber(h), member }
  end
  return { tonumber(t), tonumber(before), tonumber(h), member }
end
