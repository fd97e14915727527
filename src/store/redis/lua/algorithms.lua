-- Sluice: the five algorithms, mirroring src/algorithm/*.rs line for line (the
-- sliding log in its arithmetic: it reads a summary of its log, not every entry).
--
-- Each takes (requests, window >= 1, burst, state or nil, now, hits, leaky, within)
-- and returns the verdict as five values: admitted 0/1, remaining, reset, retry_after
-- (NEVER = never), delay; then the next state (nil when nothing changes), a refund
-- token (what refund.lua needs to give the hits back exactly) and, with a next state,
-- when that state may expire. Values, not tables: this runs on every hit. `within`
-- (leaky_bucket only; nil for none) is the longest delay the caller waits: a later
-- turn is denied, with its delay in the delay place (src/algorithm/leaky_bucket.rs,
-- `late`).

-- max(at - now, 0), as Rust's saturating `until`.
local function until_(at, now)
  if at > now then return at - now end
  return 0
end

-- fixed_window: state {window_start, count}. Windows start at `p` modulo w (the
-- burst's place carries the phase: 0 for the epoch, local midnight for a calendar
-- window, see src/algorithm/fixed_window.rs).
local function fixed_window(r, w, p, st, now, hits)
  local _, off = idiv(now - p, w)
  local start, count = now - off, 0
  if st ~= nil and st[1] >= start then
    -- Off the grid: a window of another length (the unit changed) that started in
    -- this one; its hits count here (src/algorithm/fixed_window.rs).
    local _, stray = idiv(st[1] - p, w)
    if stray == 0 then start = st[1] end
    count = st[2]
  end
  local reset = until_(start + w, now)
  local used = count + hits
  if used <= r then
    if hits > 0 then return 1, r - used, reset, 0, 0, { start, used }, start, start + w end
    return 1, r - used, reset, 0, 0, nil, start
  end
  local retry = reset
  if hits > r or reset == 0 then retry = NEVER end
  local remaining = r - count
  if remaining < 0 then remaining = 0 end
  return 0, remaining, reset, retry, 0, nil, 0
end

-- sliding_window_log: state {used, first, last, key, edge, ...}, a summary of the
-- log's live entries ({t, before, hits, member}, see log_entry) read by load_log: the
-- live hits and the oldest and newest entries, from two members whatever the log
-- holds. So a decision costs Redis the same at 10 entries and at 10,000; a denial
-- that must find which entry frees room reads at most as many entries as its excess
-- (one, for a request of one hit). The arithmetic mirrors
-- src/algorithm/sliding_window_log.rs.

-- The log of `key` as a decision at `now` sees it: entries with t > now - w count.
local function load_log(key, now, w)
  local edge = now - w
  local lo = '(' .. fmt(edge)
  local st = { used = 0, key = key, edge = edge }
  local head = redis.call('ZRANGEBYSCORE', key, lo, '+inf', 'LIMIT', 0, 1)
  if #head == 0 then return st end
  local first = log_entry(head[1])
  local last = log_entry(redis.call('ZRANGE', key, -1, -1)[1])
  if first[2] ~= nil and last[2] ~= nil then
    st.first, st.last = first, last
    st.used = last[2] + last[3] - first[2]
    return st
  end
  -- Members of the old form (an older sluice wrote them): every live entry is read
  -- and numbered once, and an admission rewrites the log in the new form.
  local before = 0
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, lo, '+inf')) do
    local e = log_entry(m)
    e[2] = before
    before = before + e[3]
    if st.first == nil then st.first = e end
    st.last = e
  end
  st.used, st.legacy = before, true
  return st
end

-- The summary after admitting `hits` at `now`: one new newest entry, or more hits in
-- the newest (same microsecond, or a clock that stepped back: they then count
-- longer). `dirty` is the entry to write, `replaced` the stored member it replaces.
local function log_add(st, now, hits)
  local last = st.last
  local nxt = {
    used = st.used + hits, first = st.first, key = st.key, edge = st.edge,
    legacy = st.legacy, replaced = st.replaced,
  }
  local e
  if last ~= nil and last[1] >= now then
    e = { last[1], last[2], last[3] + hits, nil }
    if last[4] ~= nil then nxt.replaced = last[4] end
  else
    local before = 0
    if last ~= nil then before = last[2] + last[3] end
    e = { now, before, hits, nil }
  end
  nxt.last, nxt.dirty = e, e
  if nxt.first == nil or nxt.first[1] == e[1] then nxt.first = e end
  return nxt
end

-- Timestamp of the oldest live entry whose expiry frees `excess` hits (>= 1, at
-- most the live hits).
local function log_freed(st, excess)
  local first = st.first
  if first[3] >= excess then return first[1] end
  -- Entries hold at least one hit each: the one sought is among the `excess` oldest.
  local d, freed = st.dirty, 0
  local raw = redis.call('ZRANGEBYSCORE', st.key, '(' .. fmt(st.edge), '+inf', 'LIMIT', 0, excess)
  for _, m in ipairs(raw) do
    local e = log_entry(m)
    if d ~= nil and e[1] == d[1] then e = d end
    freed = freed + e[3]
    if freed >= excess then return e[1] end
  end
  -- The newest entry, not written yet.
  return st.last[1]
end

local function sliding_window_log(r, w, _, st, now, hits)
  local used, last = st.used, st.last
  if used + hits <= r then
    local remaining = r - used - hits
    if hits == 0 then
      local reset = 0
      if r == 0 then reset = w elseif last ~= nil then reset = until_(last[1] + w, now) end
      return 1, remaining, reset, 0, 0, nil, 0
    end
    local nxt = log_add(st, now, hits)
    local at = nxt.last[1]
    return 1, remaining, until_(at + w, now), 0, 0, nxt, at, at + w
  end
  -- Denied: entries expire oldest first; wait for the first one whose expiry frees
  -- enough room.
  local retry = NEVER
  if hits <= r then retry = until_(log_freed(st, used + hits - r) + w, now) end
  local remaining = r - used
  if remaining < 0 then remaining = 0 end
  local reset = 0
  if r == 0 then reset = w elseif last ~= nil then reset = until_(last[1] + w, now) end
  return 0, remaining, reset, retry, 0, nil, 0
end

-- sliding_window_counter: state {window_start, previous, current}.

-- First elapsed time in a window at which `previous` leaves room for `need` more:
-- window - floor(need * window / previous) (saturating), nil if that is 0 room.
local function first_elapsed(need, previous, w)
  if previous == 0 then return 0 end
  if need >= previous then return 0 end -- room >= window
  local room = muldiv(need, w, previous)
  if room > 0 then return w - room end
  return nil
end

local function sliding_window_counter(r, w, _, st, now, hits)
  local _, off = idiv(now, w)
  local start, previous, current = now - off, 0, 0
  if st ~= nil and st[1] >= start then
    -- Off the grid: a window of another length, see fixed_window.
    local _, stray = idiv(st[1], w)
    if stray == 0 then start = st[1] end
    previous, current = st[2], st[3]
  elseif st ~= nil and st[1] + w == start then
    previous = st[3]
  end
  local elapsed = until_(now, start)
  -- allowance = floor((r*w - previous*(w - elapsed)) / w) = r - ceil(previous*(w-e)/w)
  local weighed = muldiv_ceil(previous, w - elapsed, w)
  local allowed = nil
  if weighed <= r then allowed = r - weighed end
  local wanted = current + hits
  local admitted = allowed ~= nil and wanted <= allowed
  local counted = current
  if admitted then counted = wanted end
  local remaining = 0
  if allowed ~= nil and allowed > counted then remaining = allowed - counted end
  local reset = 0
  if r == 0 then
    reset = w
  elseif counted > 0 then
    reset = until_(start + 2 * w, now)
  elseif previous > 0 then
    reset = until_(start + w, now)
  end
  if admitted then
    -- counted > 0 with hits > 0: the state lives two windows.
    if hits > 0 then
      return 1, remaining, reset, 0, 0, { start, previous, counted }, start, start + 2 * w
    end
    return 1, remaining, reset, 0, 0, nil, start
  end
  local retry = NEVER
  if hits <= r then
    local at = nil
    if previous > 0 and r - current - hits >= 0 then
      local e = first_elapsed(r - current - hits, previous, w)
      if e ~= nil then at = start + e end
    end
    if at == nil then
      local e = first_elapsed(r - hits, current, w)
      if e ~= nil then at = start + w + e end
    end
    if at == nil then at = start + 2 * w end
    retry = until_(at, now)
  end
  return 0, remaining, reset, retry, 0, nil, 0
end

-- token_bucket and leaky_bucket (GCRA): state {tat, rem, r, w}, the exact time at
-- which the bucket is full (the queue empty) as whole microseconds rounded up less
-- rem / r (0 <= rem < r), so nothing is rounded per request
-- (src/algorithm/token_bucket.rs works in ticks of 1 / r µs), and the rate it was
-- written under. {tat} alone is rem = 0, as an older sluice (which rounded each cost
-- up) wrote every state; without a rate, a state reads as the limit's. Each
-- product goes through muldiv:
-- (burst - hits) * w = q * r + s compares with a backlog of d - rem / r µs without
-- forming either side.

-- ceil((d * r - rem) / w): the tokens a backlog of d - rem / r µs takes.
local function gcra_owed(r, w, d, rem)
  local q, s = muldiv(d, r, w)
  if q >= HUGE then return HUGE end
  if s > rem then return q + 1 end
  if s == rem then return q end
  return q - (idiv(rem - s, w))
end

-- burst - gcra_owed, at least 0.
local function gcra_remaining(r, w, b, d, rem)
  local owed = gcra_owed(r, w, d, rem)
  if owed >= b then return 0 end
  return b - owed
end

-- Whether state `st` counts in the ticks of r per w: its rate, or none (an older
-- sluice's), or not one scripts.rs sends (at most 2^50): read as the limit's.
local function gcra_counts_in(st, r, w)
  local r0, w0 = st[3], st[4]
  return w0 == nil or r0 == 0 or w0 == 0 or r0 > 2 ^ 50 or w0 > 2 ^ 50
    or (r0 == r and w0 == w)
end

-- max(exact tat, now) of state `st` at the rate r per w, as (bt, br): bt - br / r.
-- A state written under another rate (a policy changed since) owes the same hits,
-- not the same time (token_bucket.rs `rescaled`): its backlog of B ticks of 1 / r0
-- µs is ceil(B * w / w0) ticks of 1 / r µs, at most a tat just before the end of
-- time. A debt the doubles cannot count keeps its time.
local function gcra_base(st, r, w, now)
  if st == nil or st[1] <= now then return now, 0 end
  local bt, br, r0, w0 = st[1], st[2], st[3], st[4]
  local kept = br
  if kept == nil or kept >= r then kept = 0 end
  if gcra_counts_in(st, r, w) then return bt, kept end
  if br == nil or br >= r0 then br = 0 end
  -- B = (bt - now) * r0 - br = q * w0 + s, 0 <= s < w0: q + s / w0 hits owed.
  local q, s = muldiv(bt - now, r0, w0)
  if q >= HUGE then return bt, kept end
  if s >= br then
    s = s - br
  else
    local k = idiv(br - s + w0 - 1, w0)
    q, s = q - k, s + k * w0 - br
  end
  -- B' = q * w + ceil(s * w / w0) = q2 * r + s2 + c.
  local c = muldiv_ceil(s, w, w0)
  local q2, s2 = muldiv(q, w, r)
  if q2 >= HUGE then return HUGE - 1, 0 end
  local q3, s3 = idiv(s2 + c, r)
  local d, rem = q2 + q3, 0
  if s3 > 0 then d, rem = d + 1, r - s3 end
  if d >= HUGE - now then return HUGE - 1, 0 end
  return now + d, rem
end

-- A bucket's state `st` written under another rate than r per w, rewritten in it
-- (token_bucket.rs `rebased`): decide.lua stores it whatever the call decides, so
-- that the debt drains at the new rate from the change on (read afresh each time,
-- it would drain at the old one). nil when it needs no rewrite (a full bucket
-- needs none).
local function gcra_rebased(st, r, w, now)
  if r == 0 or st[1] <= now or gcra_counts_in(st, r, w) then return nil end
  local bt, br = gcra_base(st, r, w, now)
  return { bt, br, r, w }
end

-- decide.lua's read of a committed bucket `st` (read, or left by an earlier group)
-- under r per w: when written under another rate, rewritten in this one and queued
-- to be stored whatever the call decides, as each request one after another would
-- (a group's own later hits read it as it is). Here, not in decide.lua, so that
-- a function library defines it once, not on every call.
local function gcra_read(key, st, r, w, now, known, pending, pending_expiry)
  local re = gcra_rebased(st, r, w, now)
  if re == nil then return st end
  known[key] = re
  if pending_expiry[key] == nil then pending[#pending + 1] = key end
  pending_expiry[key] = re[1]
  return re
end

local function gcra(r, w, b, st, now, hits, leaky, within)
  if r == 0 then
    -- Never admits: a reset of one window, as retry-after says.
    if hits == 0 then return 1, 0, w, 0, 0, nil, 0 end
    return 0, 0, w, NEVER, 0, nil, 0
  end
  -- base = max(exact tat, now) = bt - br / r; the backlog d - br / r, d = bt - now.
  local bt, br = gcra_base(st, r, w, now)
  local d = bt - now
  -- The room hits leave, q + s / r µs; with hits > burst, none.
  local q, s, fits = 0, 0, false
  if hits == 0 then
    q = muldiv_ceil(b, w, r)
    fits = d <= q
  elseif hits <= b then
    q, s = muldiv(b - hits, w, r)
    fits = d <= q or (d == q + 1 and br + s >= r)
  end
  -- The state after: base + hits * w / r = (bt + cq) - (br - cs) / r.
  local cq, cs = muldiv(hits, w, r)
  local nt, nr = bt + cq, br - cs
  if nr < 0 then nt, nr = nt + 1, nr + r end
  if cq >= HUGE or nt >= HUGE then nt = nil end
  if fits then
    if hits == 0 then
      return 1, gcra_remaining(r, w, b, d, br), d, 0, 0, nil, 0
    end
    if nt ~= nil then
      local delay = 0
      if leaky then
        delay = d
        if within ~= nil and d > within then
          -- Too late for the caller: denied, no place taken.
          return 0, gcra_remaining(r, w, b, d, br), d, d - within, d, nil, 0
        end
      end
      local nxt = { nt, nr, r, w }
      return 1, gcra_remaining(r, w, b, nt - now, nr), nt - now, 0, delay, nxt, 0, nt
    end
  end
  local retry = NEVER
  if nt ~= nil and hits <= b then
    -- The first whole µs at which the backlog has shrunk to the room.
    local at = bt - q
    if hits > 0 and br + s >= r then at = at - 1 end
    retry = until_(at, now)
  end
  return 0, gcra_remaining(r, w, b, d, br), d, retry, 0, nil, 0
end

-- A charge (src/algorithm/mod.rs `charge`): `fn`'s decision, and when it does not
-- fit, the state with the whole cost spent anyway, from the same decision under a
-- limit that admits anything (the windows' count, the buckets' capacity lifted; a
-- bucket's rate kept), with the verdict of another such charge on that state. No
-- delay: a charge pays for a request already served. Returns fn's eight values,
-- then what the key owes (charge.rs `owed`): the lift less the lifted decision's
-- remaining is what the new state holds, and what it holds past the capacity (a
-- bucket's burst, a window's requests) is owed; 0 when the charge fitted.
local LIFT = 2 ^ 52
local function charge(code, fn, r, w, b, st, now, hits, leaky)
  local admitted, remaining, reset, retry, _, nxt, token, expiry = fn(r, w, b, st, now, hits, leaky)
  if admitted == 1 or hits == 0 then
    return admitted, remaining, reset, retry, 0, nxt, token, expiry, 0
  end
  local lr, lb, cap = LIFT, b, r
  if code == 'tb' or code == 'lb' then lr, lb, cap = r, LIFT, b end
  local _, lremaining, _, _, _, spent, otoken, oexpiry = fn(lr, w, lb, st, now, hits, leaky)
  if spent == nil then
    -- Past the end of time (charge.rs `most_spendable`): the largest part that
    -- fits is owed, found by bisection.
    local lo, hi = 0, hits
    while hi - lo > 1 do
      local mid = lo + math.floor((hi - lo) / 2)
      local _, _, _, _, _, s = fn(lr, w, lb, st, now, mid, leaky)
      if s ~= nil then lo = mid else hi = mid end
    end
    if lo == 0 then return admitted, remaining, reset, retry, 0, nil, token, expiry, 0 end
    _, lremaining, _, _, _, spent, otoken, oexpiry = fn(lr, w, lb, st, now, lo, leaky)
  end
  local _, oremaining, oreset, oretry = fn(r, w, b, spent, now, hits, leaky)
  local owed = LIFT - lremaining - cap
  if owed < 0 then owed = 0 end
  return 0, oremaining, oreset, oretry, 0, spent, otoken, oexpiry, owed
end

-- What a key with state `st` owes at `now` (charge.rs `owed_now`): the lifted
-- check's remaining read as in `charge`; 0 for a bucket without a rate.
local function owed_now(code, fn, r, w, b, st, now, leaky)
  local lr, lb, cap = LIFT, b, r
  if code == 'tb' or code == 'lb' then
    if r == 0 then return 0 end
    lr, lb, cap = r, LIFT, b
  end
  local _, lremaining = fn(lr, w, lb, st, now, 0, leaky)
  local owed = LIFT - lremaining - cap
  if owed < 0 then return 0 end
  return owed
end

-- A refund of a counter (src/algorithm/refund.rs), not a log (decide.lua gives a
-- log's hits back itself): the state brought to `now` by one hit under a lifted
-- limit, then that hit and `hits` taken off, floored at an empty counter. Returns
-- fn's eight values: always admitted, never a delay; nil state when there was
-- nothing to give back to.
local function give_back(code, fn, r, w, b, st, now, hits, leaky)
  local nxt, expiry = nil, nil
  if hits > 0 and st ~= nil then
    local lr, lb = LIFT, b
    if code == 'tb' or code == 'lb' then lr, lb = r, LIFT end
    local _, _, _, _, _, rolled, _, rexpiry = fn(lr, w, lb, st, now, 1, leaky)
    if rolled ~= nil then
      local back = hits + 1
      if code == 'fw' then
        nxt = { rolled[1], math.max(rolled[2] - back, 0) }
      elseif code == 'sc' then
        local cur = math.min(back, rolled[3])
        nxt = { rolled[1], math.max(rolled[2] - (back - cur), 0), rolled[3] - cur }
      else
        -- Exact tat less back * w / r (as refund.lua), at least now.
        local cq, cs = muldiv(back, w, r)
        local t, rem = rolled[1] - cq, (rolled[2] or 0) + cs
        if rem >= r then t, rem = t - 1, rem - r end
        if t < now or (t == now and rem > 0) then t, rem = now, 0 end
        nxt = { t, rem, r, w }
        rexpiry = t
      end
      expiry = rexpiry
    end
  end
  local _, remaining, reset = fn(r, w, b, nxt or st, now, 0, leaky)
  return 1, remaining, reset, 0, 0, nxt, 0, expiry
end

-- The algorithm of a code as sent by scripts.rs (the caller passes leaky = code ==
-- 'lb'), nil if unknown. Not a table: its constructor would run on every call.
local function algorithm(code)
  if code == 'sc' then return sliding_window_counter end
  if code == 'fw' then return fixed_window end
  if code == 'tb' or code == 'lb' then return gcra end
  if code == 'sl' then return sliding_window_log end
  return nil
end
