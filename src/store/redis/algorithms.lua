-- Sluice: the five algorithms, mirroring src/algorithm/*.rs line for line.
--
-- Each takes (limit, state or nil, now, hits) and returns a verdict
-- {admitted 0/1, remaining, reset, retry_after (NEVER = never), delay}, the next
-- state (nil when nothing changes) and a refund token: what refund.lua needs to give
-- the hits back exactly. Limits are {r = requests, w = window >= 1, b = burst}.

local function verdict(admitted, remaining, reset, retry, delay)
  return { admitted and 1 or 0, remaining, reset, retry, delay }
end

-- max(at - now, 0), as Rust's saturating `until`.
local function until_(at, now)
  if at > now then return at - now end
  return 0
end

-- fixed_window: state {window_start, count}.
local function fixed_window(l, st, now, hits)
  local w = l.w
  local _, off = idiv(now, w)
  local start, count = now - off, 0
  if st ~= nil and st[1] >= start then start, count = st[1], st[2] end
  local reset = until_(start + w, now)
  local used = count + hits
  if used <= l.r then
    local nxt = nil
    if hits > 0 then nxt = { start, used } end
    return verdict(true, l.r - used, reset, 0, 0), nxt, start
  end
  local retry = reset
  if hits > l.r or reset == 0 then retry = NEVER end
  local remaining = l.r - count
  if remaining < 0 then remaining = 0 end
  return verdict(false, remaining, reset, retry, 0), nil, 0
end

local function fixed_window_expires(l, st)
  return st[1] + l.w
end

-- sliding_window_log: state {{t, h}, ...} live entries in increasing t.
local function sliding_window_log(l, st, now, hits)
  local w = l.w
  local entries = st or {}
  local used = 0
  for i = 1, #entries do used = used + entries[i][2] end
  local last = entries[#entries]
  if used + hits <= l.r then
    local remaining = l.r - used - hits
    if hits == 0 then
      local reset = 0
      if last ~= nil then reset = until_(last[1] + w, now) end
      return verdict(true, remaining, reset, 0, 0), nil, 0
    end
    local kept = {}
    for i = 1, #entries do kept[i] = { entries[i][1], entries[i][2] } end
    local at
    if last ~= nil and last[1] >= now then
      kept[#kept][2] = kept[#kept][2] + hits
      at = last[1]
    else
      kept[#kept + 1] = { now, hits }
      at = now
    end
    return verdict(true, remaining, until_(at + w, now), 0, 0), kept, at
  end
  local retry = NEVER
  if hits <= l.r then
    local excess = used + hits - l.r
    local freed = 0
    for i = 1, #entries do
      freed = freed + entries[i][2]
      if freed >= excess then
        retry = until_(entries[i][1] + w, now)
        break
      end
    end
  end
  local remaining = l.r - used
  if remaining < 0 then remaining = 0 end
  local reset = 0
  if last ~= nil then reset = until_(last[1] + w, now) end
  return verdict(false, remaining, reset, retry, 0), nil, 0
end

local function sliding_window_log_expires(l, st)
  local last = st[#st]
  if last == nil then return 0 end
  return last[1] + l.w
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

local function sliding_window_counter(l, st, now, hits)
  local w, r = l.w, l.r
  local _, off = idiv(now, w)
  local start, previous, current = now - off, 0, 0
  if st ~= nil and st[1] >= start then
    start, previous, current = st[1], st[2], st[3]
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
  if counted > 0 then
    reset = until_(start + 2 * w, now)
  elseif previous > 0 then
    reset = until_(start + w, now)
  end
  if admitted then
    local nxt = nil
    if hits > 0 then nxt = { start, previous, counted } end
    return verdict(true, remaining, reset, 0, 0), nxt, start
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
  return verdict(false, remaining, reset, retry, 0), nil, 0
end

local function sliding_window_counter_expires(l, st)
  local windows = 0
  if st[3] > 0 then windows = 2 elseif st[2] > 0 then windows = 1 end
  return st[1] + l.w * windows
end

-- token_bucket and leaky_bucket (GCRA): state {tat}.

-- Largest backlog at which `hits` still fit, nil when hits > burst.
local function slack(l, hits)
  if hits > l.b then return nil end
  if hits == 0 then return muldiv_ceil(l.b, l.w, l.r) end
  return (muldiv(l.b - hits, l.w, l.r))
end

-- burst - ceil(backlog * requests / window), at least 0.
local function gcra_remaining(l, backlog)
  local owed = muldiv_ceil(backlog, l.r, l.w)
  if owed >= l.b then return 0 end
  return l.b - owed
end

local function gcra(l, st, now, hits, leaky)
  if l.r == 0 then
    local retry = NEVER
    if hits == 0 then retry = 0 end
    return verdict(hits == 0, 0, 0, retry, 0), nil, 0
  end
  local tat = now
  if st ~= nil then tat = st[1] end
  local base = tat
  if now > base then base = now end
  local backlog = base - now
  local room = slack(l, hits)
  local cost = muldiv_ceil(hits, l.w, l.r)
  local next_tat = nil
  if cost < HUGE and base + cost < HUGE then next_tat = base + cost end
  if room ~= nil and backlog <= room then
    if hits == 0 then
      return verdict(true, gcra_remaining(l, backlog), backlog, 0, 0), nil, 0
    end
    if next_tat ~= nil then
      local delay = 0
      if leaky then delay = backlog end
      return verdict(true, gcra_remaining(l, next_tat - now), next_tat - now, 0, delay),
        { next_tat }, cost
    end
  end
  local retry = NEVER
  if next_tat ~= nil and room ~= nil then
    local at = tat - room
    if at < 0 then at = 0 end
    retry = until_(at, now)
  end
  return verdict(false, gcra_remaining(l, backlog), backlog, retry, 0), nil, 0
end

local function token_bucket(l, st, now, hits) return gcra(l, st, now, hits, false) end
local function leaky_bucket(l, st, now, hits) return gcra(l, st, now, hits, true) end
local function gcra_expires(_, st) return st[1] end

-- Algorithm codes as sent by scripts.rs.
local ALGORITHMS = {
  fw = { decide = fixed_window, expires = fixed_window_expires },
  sl = { decide = sliding_window_log, expires = sliding_window_log_expires, log = true },
  sc = { decide = sliding_window_counter, expires = sliding_window_counter_expires },
  tb = { decide = token_bucket, expires = gcra_expires },
  lb = { decide = leaky_bucket, expires = gcra_expires },
}
