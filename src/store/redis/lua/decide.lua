-- Sluice: decide the hits of one or more requests on this shard, atomically.
--
-- Why Lua and not MULTI/EXEC: the decision is check-then-consume across several keys
-- (consume only if every limit admits), which MULTI/EXEC cannot express without
-- WATCH and retries under contention; a script runs atomically in one round trip,
-- and reads the clock (TIME) on the server, so every sluice replica decides with the
-- same clock.
--
-- One call decides one group of hits (one request's share of this shard) or several
-- (the store coalesces the requests queued for a shard). Groups are decided one
-- after another, each all-or-nothing, each seeing what the earlier groups committed
-- (counters are written once at the end of the call, logs as each group commits):
-- the outcome equals the requests arriving back to back at one instant.
--
-- KEYS: the counters of every hit, group after group (a key may repeat: the later
-- hit sees the earlier one's state). ARGV[1]: fixed now in microseconds (tests only)
-- or ''. ARGV[2]: the number L of distinct limits in the call, then per limit 5
-- values: algorithm code, requests, window, burst, mode ('e' enforce, 's' shadow,
-- 'q' quota; upper case for a charge, spent whole even when denied; 'R' a refund,
-- given back and never denied: a group holds charges and refunds only, or none). Then per group: its number of hits m, negated (-m) when quota-mode
-- hits of this request live on other shards (so an all-denied quota here does not
-- deny on its own); then per hit its limit's number j (1..L) for one hit, or -j
-- followed by its hits, and for a leaky_bucket limit one value more: the longest
-- delay in microseconds its caller waits for its turn (-1 for no bound). Limits are sent once per call and a one-hit hit is one
-- value: a coalesced call's hits share a few limits, and every argument costs Redis
-- a parse.
--
-- Returns, group after group: {consumed 0/1, then per hit: admitted, remaining,
-- reset, retry_after, delay, refund token, next_room}, then the `now` it decided at.
-- A charge holds no answer, so its delay place carries what the key owes after it,
-- negated (-owed, 0 when nothing is owed): no value more for any hit. A request
-- denied because its leaky_bucket turn comes after its longest delay carries that
-- turn there (> 0, where every other denial has 0).
-- next_room: after an admission that leaves no room (remaining 0, hits > 0), a
-- charge past the limit, or a denial that no wait ends (retry_after never, hits >
-- 0), the retry_after of a one-hit request on the new state (so the caller can
-- cache the denial it implies, or give a never-fitting request a retry-after); 0
-- otherwise.

-- Now: the test hook's fixed time when given, else the Redis server's clock, so every
-- replica of sluice decides with one clock per counter.
local now, server_clock = nil, false
if ARGV[1] ~= nil and ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  server_clock = true
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Presized for the common single hit: growing { 0 } to 8 values reallocates 3 times.
local out, n = {}, 0
if #KEYS == 1 then out = { 0, 0, 0, 0, 0, 0, 0, 0 } end

-- The call's limits, each argument parsed once. An unknown code fails the call
-- before any group is decided: an error must not leave earlier groups consumed.
-- One flat table, 7 slots per limit (code, algorithm, requests, window, burst, mode,
-- charge): one allocation per call, however many limits.
local nlimits = tonumber(ARGV[2])
local lim = { nil, nil, nil, nil, nil, nil, nil }
for j = 1, nlimits do
  local a, l = 2 + (j - 1) * 5, (j - 1) * 7
  local code = ARGV[a + 1]
  local fn = algorithm(code)
  if fn == nil then
    return redis.error_reply('sluice: unknown algorithm ' .. tostring(code))
  end
  local w = tonumber(ARGV[a + 3])
  if w < 1 then w = 1 end
  lim[l + 1] = code
  lim[l + 2] = fn
  lim[l + 3] = tonumber(ARGV[a + 2])
  lim[l + 4] = w
  lim[l + 5] = tonumber(ARGV[a + 4])
  local mode = ARGV[a + 5]
  local lower = string.lower(mode)
  lim[l + 6] = lower
  -- How the hits spend: false (if the group is admitted), 'charge' or 'refund'.
  local spend = false
  if mode == 'R' then spend = 'refund' elseif lower ~= mode then spend = 'charge' end
  lim[l + 7] = spend
end
local at, k0 = 3 + nlimits * 5, 0

-- Counter states (not logs) as the next group sees them: read once per call, or
-- committed by earlier groups and written once at the end. A hot key shared by many
-- coalesced requests is read and written once per call instead of once per request,
-- checks (which change nothing) included. key -> state (false: none), and the keys
-- to write in first-commit order with the expiry of their last change.
local known, pending, pending_expiry = {}, {}, {}
-- Log summaries as Redis holds them now (after the earlier groups' commits), so the
-- groups of a call on one hot log read it once: key -> summary.
local log_seen = {}
-- Window start of a fixed_window or sliding_window_counter state as read from Redis:
-- written back in the same window, its expiry (the window's end) is the one the key
-- already has, so SET .. KEEPTTL spares Redis removing and re-adding it. Server clock
-- only: under the tests' fixed time the key's TTL was set against another clock.
local read_start = {}

-- Writes a log's summary `st` after its group's change (window lw, expiring at
-- `expiry`) into its sorted set, and remembers what the next group reads back.
local function write_log(key, st, lw, expiry)
  local d = st.dirty
  if st.legacy then
    -- Written by an older sluice: every live entry again, in the new form.
    local raw = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - lw), '+inf')
    redis.call('DEL', key)
    local before = 0
    for _, m in ipairs(raw) do
      local e = log_entry(m)
      if e[1] ~= d[1] then
        redis.call('ZADD', key, fmt(e[1]), log_member(e[1], before, e[3]))
        before = before + e[3]
      end
    end
    d[2] = before
    log_seen[key] = nil
  else
    if st.replaced ~= nil then redis.call('ZREM', key, st.replaced) end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - lw))
  end
  local member = log_member(d[1], d[2], d[3])
  redis.call('ZADD', key, fmt(d[1]), member)
  redis.call('PEXPIRE', key, ttl_ms(expiry, now))
  if log_seen[key] ~= nil then
    -- What the next group would read back.
    d[4] = member
    log_seen[key] = { used = st.used, first = st.first, last = d, key = key, edge = st.edge }
  end
end

-- A refund of a log (src/algorithm/refund.rs): `hits` taken off its newest live
-- entries, at most all of them. Older entries keep their numbering (`before`
-- counts only what precedes them), and the key its TTL.
local function take_from_log(key, now, w, hits)
  local left = hits
  while left > 0 do
    local m = redis.call('ZRANGE', key, -1, -1)[1]
    if m == nil then return end
    local e = log_entry(m)
    if e[1] <= now - w then return end
    redis.call('ZREM', key, m)
    if e[3] > left then
      redis.call('ZADD', key, fmt(e[1]), log_member(e[1], e[2], e[3] - left))
      return
    end
    left = left - e[3]
  end
end

-- Decides one group per round: its m hits are KEYS[k0 + 1 ..], their arguments start
-- at ARGV[at]; appends its consumed flag and verdicts to out.
while at <= #ARGV do
  local m = tonumber(ARGV[at])
  local quota_elsewhere = m < 0
  if quota_elsewhere then m = -m end
  at = at + 1
  -- One counter hit (uniform keys; a shard's share of a spread request): decided
  -- without the tables of states and changes a group needs, which cost Redis more
  -- than the hit. Logs (sl) take the general path. Its load, commit and verdict
  -- steps repeat the general path's inline on purpose: as Lua functions they cost
  -- Redis more per call (scripts/lua-cost.sh u10, l10).
  local one = false
  if m == 1 then
    local j1 = tonumber(ARGV[at])
    if j1 < 0 then j1 = -j1 end
    one = lim[(j1 - 1) * 7 + 1] ~= 'sl'
  end
  if one then
    local j, hits = tonumber(ARGV[at]), 1
    if j < 0 then
      j, hits = -j, tonumber(ARGV[at + 1])
      at = at + 1
    end
    at = at + 1
    local l = (j - 1) * 7
    local code, decide = lim[l + 1], lim[l + 2]
    local leaky, within = code == 'lb', nil
    if leaky then
      within = tonumber(ARGV[at])
      at = at + 1
      if within < 0 then within = nil end
    end
    local r, w, b, mode, spend_all = lim[l + 3], lim[l + 4], lim[l + 5], lim[l + 6], lim[l + 7]
    local key = KEYS[k0 + 1]
    local st = known[key]
    if st == nil then
      local s = redis.call('GET', key)
      if s then
        st = decode(s, code)
        if server_clock and (code == 'fw' or code == 'sc') then read_start[key] = st[1] end
      end
      known[key] = st or false
    end
    st = st or nil
    -- A bucket under another rate is rewritten in this one (gcra_read).
    if st and (code == 'tb' or code == 'lb') then
      st = gcra_read(key, st, r, w, now, known, pending, pending_expiry)
    end
    local admitted, remaining, reset, retry, delay, nxt, token, expiry, owed
    if spend_all == 'refund' then
      admitted, remaining, reset, retry, delay, nxt, token, expiry =
        give_back(code, decide, r, w, b, st, now, hits, leaky)
    elseif spend_all then
      admitted, remaining, reset, retry, delay, nxt, token, expiry, owed =
        charge(code, decide, r, w, b, st, now, hits, leaky)
      delay = -owed
    else
      admitted, remaining, reset, retry, delay, nxt, token, expiry =
        decide(r, w, b, st, now, hits, leaky, within)
    end
    if nxt ~= nil then st = nxt end
    local room = 0
    if spend_all ~= 'refund' and hits > 0
      and ((admitted == 1 and remaining == 0) or (admitted == 0 and (nxt ~= nil or retry == NEVER))) then
      room = (select(4, decide(r, w, b, st, now, 1, leaky)))
    end
    -- The admitted() rule for one hit: a denied enforced hit, or a denied quota hit
    -- with no quota elsewhere, consumes nothing; a charge always does.
    local consumed = 1
    if not spend_all and admitted == 0 and (mode == 'e' or (mode == 'q' and not quota_elsewhere)) then
      consumed = 0
    elseif nxt ~= nil then
      known[key] = nxt
      if pending_expiry[key] == nil then pending[#pending + 1] = key end
      pending_expiry[key] = expiry
    end
    out[n + 1] = consumed
    out[n + 2] = admitted
    out[n + 3] = remaining
    out[n + 4] = reset
    out[n + 5] = retry
    out[n + 6] = delay
    out[n + 7] = token
    out[n + 8] = room
    n = n + 8
  else
    local states = {}   -- key -> state as the next hit sees it, false if none once loaded
    local changed = {}  -- keys with a state to write, in first-change order
    local expires = {}  -- key -> when its state may expire, from its last change
    local logs = nil    -- sl key -> window of its last change
    local flushed = {}  -- sl keys written early by a refund in this group
    local head = n + 1
    out[head] = 0
    local o = head
    local enforce_denied, quota_seen, quota_ok, charges = false, false, false, false

    for i = 1, m do
      local j, hits = tonumber(ARGV[at]), 1
      if j < 0 then
        j, hits = -j, tonumber(ARGV[at + 1])
        at = at + 1
      end
      at = at + 1
      local l = (j - 1) * 7
      local code, decide = lim[l + 1], lim[l + 2]
      local log, leaky, within = code == 'sl', code == 'lb', nil
      if leaky then
        within = tonumber(ARGV[at])
        at = at + 1
        if within < 0 then within = nil end
      end
      local r, w, b, mode, spend_all = lim[l + 3], lim[l + 4], lim[l + 5], lim[l + 6], lim[l + 7]
      local key = KEYS[k0 + i]
      local st = states[key]
      if st == nil then
        if log then
          st = log_seen[key]
          if st == nil or st.edge ~= now - w then
            st = load_log(key, now, w)
            log_seen[key] = st
          end
        else
          st = known[key]
          if st == nil then
            local s = redis.call('GET', key)
            if s then
              st = decode(s, code)
              if server_clock and (code == 'fw' or code == 'sc') then read_start[key] = st[1] end
            end
            known[key] = st or false
          end
          if st and (code == 'tb' or code == 'lb') then
            st = gcra_read(key, st, r, w, now, known, pending, pending_expiry)
          end
        end
        states[key] = st or false
      end
      st = st or nil
      local admitted, remaining, reset, retry, delay, nxt, token, expiry, owed
      if spend_all then charges = true end
      if spend_all == 'refund' and log then
        -- A log's hits go back from its newest entries, written at once: the
        -- group's own change to this log first, then the entries, then the log
        -- read again as the next hit sees it.
        if logs ~= nil and logs[key] ~= nil then
          write_log(key, st, logs[key], expires[key])
          logs[key] = nil
          flushed[key] = true
        end
        take_from_log(key, now, w, hits)
        st = load_log(key, now, w)
        log_seen[key] = st
        states[key] = st
        local _
        _, remaining, reset = decide(r, w, b, st, now, 0, leaky)
        admitted, retry, delay, token = 1, 0, 0, 0
      elseif spend_all == 'refund' then
        admitted, remaining, reset, retry, delay, nxt, token, expiry =
          give_back(code, decide, r, w, b, st, now, hits, leaky)
      elseif spend_all then
        admitted, remaining, reset, retry, delay, nxt, token, expiry, owed =
          charge(code, decide, r, w, b, st, now, hits, leaky)
        delay = -owed
      else
        admitted, remaining, reset, retry, delay, nxt, token, expiry =
          decide(r, w, b, st, now, hits, leaky, within)
      end
      if nxt ~= nil then
        st = nxt
        states[key] = nxt
        if expires[key] == nil then changed[#changed + 1] = key end
        expires[key] = expiry
        if log then
          if logs == nil then logs = {} end
          logs[key] = w
        end
      end
      if mode == 'e' and admitted == 0 then enforce_denied = true end
      if mode == 'q' then
        quota_seen = true
        if admitted == 1 then quota_ok = true end
      end
      local room = 0
      if spend_all ~= 'refund' and hits > 0
        and ((admitted == 1 and remaining == 0) or (admitted == 0 and (nxt ~= nil or retry == NEVER))) then
        -- Mirrors algorithm::decide (and charge); only when the key is full, after a
        -- charge past the limit, or for a request that no wait admits: rarely paid.
        room = (select(4, decide(r, w, b, st, now, 1, leaky)))
      end
      -- One at a time: a multiple assignment stores right to left, out of array order.
      out[o + 1] = admitted
      out[o + 2] = remaining
      out[o + 3] = reset
      out[o + 4] = retry
      out[o + 5] = delay
      out[o + 6] = token
      out[o + 7] = room
      o = o + 7
    end
    n = o

    -- The shared admitted() rule of src/store/mod.rs; a denied group writes nothing,
    -- unless it is of charges, which are spent whole whatever the verdicts.
    if charges or not (enforce_denied or (quota_seen and not quota_ok and not quota_elsewhere)) then
      for _, key in ipairs(changed) do
        local st = states[key]
        local lw = logs and logs[key]
        if lw then
          write_log(key, st, lw, expires[key])
        elseif not flushed[key] then
          known[key] = st
          if pending_expiry[key] == nil then pending[#pending + 1] = key end
          pending_expiry[key] = expires[key]
        end
      end
      out[head] = 1
    end
  end
  k0 = k0 + m
end
for _, key in ipairs(pending) do
  local st = known[key]
  if read_start[key] ~= nil and read_start[key] == st[1] then
    redis.call('SET', key, encode(st), 'KEEPTTL')
  else
    -- PSETEX rather than SET .. PX: Redis parses no options.
    redis.call('PSETEX', key, ttl_ms(pending_expiry[key], now), encode(st))
  end
end
-- Last, the time the call decided at: the caller bounds its shard's clock offset.
out[n + 1] = now
return out
