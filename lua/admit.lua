-- admit.lua: takes one or more admission decisions, each all-or-nothing, in one call.
--
-- Every key of a call carries the hash tag of one shard ({N}), so the call touches one
-- Redis Cluster slot. The clock is Redis TIME. Decisions of a call are taken one after the
-- other; a decision sees what the ones before it consumed.
--
-- Cost is what this script is written for (docs/admission.md, "Performance"): globals are
-- made locals once, no table per limit, no float formatting, one HMGET of the org's state
-- hash and one MGET of the quota counters per decision at most (none when an earlier
-- decision of the call read them), writes once at the end of the call.
--
-- KEYS[1]    the shard's outbox stream
-- KEYS[1+d]  the state hash of decision d's org ("<tag>s:<org>"): one field per token
--            bucket, "<account>:<unit letter>" -> the bucket's theoretical arrival time
--            (GCRA), integer µs since the epoch; the bucket is full when it is <= now. The
--            hash expires when its latest bucket is full again (a missing field is a full
--            bucket).
--
-- ARGV, the call header (names as read below):
--   decisions                     number of decisions
--   lo, hi                        ms since the epoch: Redis TIME must be in [lo, hi) (the
--                                 start of the current day, the end of the next day)
--   m_next                        start of the next month, ms
--   m_label, m_next_label         labels of the current and the next month ("YYYY-MM")
--   m_expiry, m_next_expiry       expiry (ms since the epoch) of quota counters of the
--                                 current / next month
--   d_next, d_label, d_next_label, d_expiry, d_next_expiry: the same for days
--   tag                           the shard's key start ("<prefix>{N}:"): void marks,
--                                 lease records, idempotency buckets
--   lease_ttl                     ms a concurrency lease is held without an outcome
--   idem_w                        the idempotency window W, ms: a record lives in the hash
--                                 "<tag>i:<floor(now / W)>", looked up there and in the
--                                 previous one, which expires 2 W after its start
--
-- Then per decision (a cursor walks ARGV):
--   event_id, idem (field of the idempotency record, "" without a key), legacy (the key of
--   a record of the one-key-per-record layout to look up too, "" for none), legacy_fp (the
--   fingerprint of the units and tool as such records hold it), fingerprint (its short
--   hash, as bucket records hold it), id_tail (".<shard>.<org>": how event ids of the org
--   end), n_bucket, n_window, n_quota, n_conc, ev (the compact usage event up to its
--   time, see pkg/admission/event.go)
--   The idempotency record is "<event id> <period> <fingerprint>\n<attempts>": the event
--   ids of the requests that were answered with this decision (the first and each replay)
--   and not voided since (void.lua). A record without "\n" has one attempt, its own. An
--   event id written "~<uuid>" is "<uuid><id_tail>" (records are scoped by account, so
--   by org: the tail is the reader's too).
--   per token bucket:    field; inc = amount × emission interval, µs; win = burst ×
--                        emission interval, µs (Go derives both from the policy)
--   per sliding window:  key, amount, width (ms), limit
--   per quota:           prefix (the counter's key but for its period label), amount,
--                        quota (-1 counts without capping), kind: period ('m' or 'd')
--   per concurrency:     key (lease sorted set), cap
--
-- Reply: {CLOCK_OFF, sec, usec} when TIME is outside the bounds given (the caller's clock
-- is off: it recomputes the bounds from sec and calls again); otherwise
-- {DECIDED, sec, usec, d_1, ...} with per decision {code, a, b, replayed, state...}:
--   ALLOWED:            a = event id, b = period label charged
--   RATE_LIMITED:       a = index of the blocking limit (buckets, then windows, then
--                       concurrency), b = retry after, ms (-1: never at this size)
--   OVER_QUOTA:         a = index of the blocking quota, b = its period label
--   IDEMPOTENCY_REUSED: the idempotency key was used before with other units
-- state, integers: per bucket µs until it is full, per window {remaining, ms until clear},
-- per quota {used}; after the charge when allowed, as found when denied. Go derives the
-- RateLimit fields from them and the policy it holds.
--
-- The contract with Go (pkg/admission/admitter.go): each block of arguments is read once,
-- by one `local <names> = unpack(A, ...)` marked "-- layout: <block>", and the reply codes
-- are the capitalised locals marked "-- layout: reply". Go declares the same names in the
-- same order, and TestScriptLayout (pkg/admission) parses this file to compare.

-- layout: reply
local CLOCK_OFF, DECIDED = 0, 1
local ALLOWED, RATE_LIMITED, OVER_QUOTA, IDEMPOTENCY_REUSED = 1, 2, 3, 4

local A, K, call, tonumber, unpack, fmt, match, sub = ARGV, KEYS, redis.call, tonumber, unpack, string.format, string.match, string.sub
local floor, ceil, pairs = math.floor, math.ceil, pairs

local time = call('TIME')
local sec, usec = time[1], time[2]
local now_us = tonumber(sec) * 1000000 + tonumber(usec)
local now = now_us / 1000 -- ms

-- layout: call
local decisions, lo, hi, m_next, m_label, m_next_label, m_expiry, m_next_expiry, d_next, d_label,
  d_next_label, d_expiry, d_next_expiry, tag, lease_ttl, idem_w = unpack(A, 1, 16)
local a = 17 -- cursor into ARGV: the first decision's
if now < tonumber(lo) or now >= tonumber(hi) then
  return {CLOCK_OFF, tonumber(sec), tonumber(usec)}
end
local period, m_exp = m_label, m_expiry
if now >= tonumber(m_next) then period, m_exp = m_next_label, m_next_expiry end
local day, d_exp = d_label, d_expiry
if now >= tonumber(d_next) then day, d_exp = d_next_label, d_next_expiry end
lease_ttl = tonumber(lease_ttl)
local idem_b, idem_cur, idem_prev -- the idempotency buckets, named at the first key
local idem_written = false
local stamp = sec .. '|' .. usec .. '|' .. period -- ends every usage event

-- State read once per call and written back once at the end.
local st = {}     -- state hash -> {field -> TAT µs, or false when absent}
local dirty = {}  -- state hash -> {field -> true}
local idle = {}   -- state hash -> the longest win of the buckets written, µs
local used = {}   -- quota counter key -> units used
local qexp = {}   -- quota counter key written -> its expiry
-- The current decision's limits, in arrays reused by every decision (no table per limit).
local bf, bi, bw, bt = {}, {}, {}, {}     -- bucket: field, inc, win, new TAT
local wk, wa, wp, wc, ws                  -- window: key, amount, width, limit, entries
local qk, qa, qc, qd = {}, {}, {}, {}     -- quota: key, amount, quota, daily
local ck, cc                              -- concurrency: key, cap

-- window returns the units in the sliding window at key and its entries (member, score)
-- oldest first. A member is "<event id>:<amount>".
local function window(key, width)
  call('ZREMRANGEBYSCORE', key, '-inf', '(' .. (now - width))
  local entries = call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local sum = 0
  for i = 1, #entries, 2 do
    sum = sum + (tonumber(match(entries[i], ':(%d+)$')) or 1)
  end
  return sum, entries
end

local out = {DECIDED, tonumber(sec), tonumber(usec)}

for dn = 1, tonumber(decisions) do
  -- layout: decision
  local event_id, idem, legacy, legacy_fp, fingerprint, id_tail, n_bucket, n_window, n_quota, n_conc,
    ev = unpack(A, a, a + 10)
  a = a + 11
  n_bucket, n_window, n_quota, n_conc = tonumber(n_bucket), tonumber(n_window), tonumber(n_quota), tonumber(n_conc)
  local hash = K[1 + dn]

  -- Read the limits; fetch the state not read yet by this call.
  local s = st[hash]
  if not s then s = {}; st[hash] = s end
  local miss, mn = nil, 0
  for i = 1, n_bucket do
    -- layout: bucket
    local field, inc, win = unpack(A, a, a + 2)
    a = a + 3
    bf[i], bi[i], bw[i] = field, tonumber(inc), tonumber(win)
    if s[field] == nil then
      if not miss then miss = {} end
      mn = mn + 1; miss[mn] = field; s[field] = false
    end
  end
  if mn > 0 then
    local v = call('HMGET', hash, unpack(miss, 1, mn))
    for i = 1, mn do s[miss[i]] = tonumber(v[i]) or false end
  end
  if n_window > 0 and not wk then wk, wa, wp, wc, ws = {}, {}, {}, {}, {} end
  for i = 1, n_window do
    -- layout: window
    local key, amount, width, limit = unpack(A, a, a + 3)
    a = a + 4
    wk[i], wa[i], wp[i], wc[i], ws[i] = key, tonumber(amount), tonumber(width), tonumber(limit), false
  end
  miss, mn = nil, 0
  for i = 1, n_quota do
    -- layout: quota
    local prefix, amount, quota, kind = unpack(A, a, a + 3)
    a = a + 4
    local daily = kind == 'd'
    local key = prefix .. (daily and day or period)
    qk[i], qa[i], qc[i], qd[i] = key, tonumber(amount), tonumber(quota), daily
    if used[key] == nil then
      if not miss then miss = {} end
      mn = mn + 1; miss[mn] = key; used[key] = 0
    end
  end
  if mn > 0 then
    local v = call('MGET', unpack(miss, 1, mn))
    for i = 1, mn do used[miss[i]] = tonumber(v[i]) or 0 end
  end
  if n_conc > 0 and not ck then ck, cc = {}, {} end
  for i = 1, n_conc do
    -- layout: conc
    local key, cap = unpack(A, a, a + 1)
    a = a + 2
    ck[i], cc[i] = key, tonumber(cap)
  end

  -- Idempotency: a key seen before returns the first decision and charges nothing, and
  -- this request becomes one more attempt of it. A decision voided since (every attempt
  -- unanswered: void.lua) is forgotten: the request is decided afresh.
  local code, ra, rb, replayed = 0, '', '', 0 -- 0: undecided while the checks run
  if idem ~= '' then
    if not idem_b then
      idem_w = tonumber(idem_w)
      idem_b = floor(now / idem_w)
      idem_cur, idem_prev = tag .. 'i:' .. idem_b, tag .. 'i:' .. (idem_b - 1)
    end
    local where = idem_cur
    local rec = call('HGET', idem_cur, idem)
    if not rec then where = idem_prev; rec = call('HGET', idem_prev, idem) end
    if not rec and legacy ~= '' then where = false; rec = call('GET', legacy) end
    if rec then
      local head, attempts = match(rec, '^([^\n]*)\n?(.*)$')
      local id, p, fp = match(head, '^(%S+) (%S+) (.*)$')
      if sub(id, 1, 1) == '~' then id = sub(id, 2) .. id_tail end
      if call('EXISTS', tag .. 'v:' .. id) == 1 then
        rec = false
      elseif fp == (where and fingerprint or legacy_fp) then
        code, ra, rb, replayed = ALLOWED, id, p, 1
        if attempts == '' then attempts = id end
        rec = head .. '\n' .. attempts .. ' ' .. event_id
        if where then call('HSET', where, idem, rec) else call('SET', legacy, rec, 'KEEPTTL') end
      else
        code = IDEMPOTENCY_REUSED
      end
    end
  end

  -- Check every limit before consuming anything: rate limits and concurrency (429, the
  -- longest wait wins), then quotas (402, the highest level wins).
  if code == 0 then
    local worst, worst_retry = 0, 0
    for i = 1, n_bucket do
      local tat, inc, win = s[bf[i]] or now_us, bi[i], bw[i]
      if tat < now_us then tat = now_us end
      tat = tat + inc
      bt[i] = tat
      if tat - now_us > win then
        local retry = inc > win and -1 or ceil((tat - now_us - win) / 1000)
        if worst == 0 or worst_retry >= 0 and (retry < 0 or retry > worst_retry) then
          worst, worst_retry = i, retry
        end
      end
    end
    for i = 1, n_window do
      local sum, entries = window(wk[i], wp[i])
      ws[i] = entries
      local amount, width, limit = wa[i], wp[i], wc[i]
      if sum + amount > limit then
        local retry = -1
        if amount <= limit then
          local freed = 0
          for j = 1, #entries, 2 do
            freed = freed + (tonumber(match(entries[j], ':(%d+)$')) or 1)
            if sum - freed + amount <= limit then
              retry = math.max(1, ceil(tonumber(entries[j + 1]) + width - now))
              break
            end
          end
        end
        if worst == 0 or worst_retry >= 0 and (retry < 0 or retry > worst_retry) then
          worst, worst_retry = n_bucket + i, retry
        end
      end
    end
    for i = 1, n_conc do
      local key = ck[i]
      call('ZREMRANGEBYSCORE', key, '-inf', now)
      if call('ZCARD', key) >= cc[i] then
        local first = call('ZRANGE', key, 0, 0, 'WITHSCORES')
        local retry = first[2] and math.max(1, math.min(1000, ceil(tonumber(first[2]) - now))) or 1000
        if worst == 0 or worst_retry >= 0 and retry > worst_retry then
          worst, worst_retry = n_bucket + n_window + i, retry
        end
      end
    end
    if worst > 0 then
      code, ra, rb = RATE_LIMITED, worst, worst_retry
    else
      for i = 1, n_quota do
        if qc[i] >= 0 and used[qk[i]] + qa[i] > qc[i] then
          code, ra, rb = OVER_QUOTA, i, qd[i] and day or period
          break
        end
      end
    end
  end

  -- All passed: consume everything, take the leases, remember the idempotency key and
  -- write the usage event to the outbox, all in this script.
  if code == 0 then
    code, ra, rb = ALLOWED, event_id, period
    if n_bucket > 0 then
      local dh = dirty[hash]
      if not dh then dh = {}; dirty[hash] = dh end
      local top = idle[hash] or 0
      for i = 1, n_bucket do
        local f = bf[i]
        s[f] = bt[i]; dh[f] = true
        if bw[i] > top then top = bw[i] end
      end
      idle[hash] = top
    end
    for i = 1, n_window do
      call('ZADD', wk[i], now, event_id .. ':' .. wa[i])
      call('PEXPIRE', wk[i], ceil(wp[i]) + 1000)
      ws[i] = false -- read again below, with this entry
    end
    if n_conc > 0 then
      local held = {}
      for i = 1, n_conc do
        call('ZADD', ck[i], now + lease_ttl, event_id)
        call('PEXPIRE', ck[i], lease_ttl)
        held[i] = ck[i]
      end
      call('SET', tag .. 'l:' .. event_id, table.concat(held, ' '), 'PX', lease_ttl)
    end
    for i = 1, n_quota do
      local key = qk[i]
      used[key] = used[key] + qa[i]
      qexp[key] = qd[i] and d_exp or m_exp
    end
    if idem ~= '' then
      local n = #event_id - #id_tail
      local id = event_id
      if n > 0 and id_tail ~= '' and sub(event_id, n + 1) == id_tail then id = '~' .. sub(event_id, 1, n) end
      call('HSET', idem_cur, idem, id .. ' ' .. period .. ' ' .. fingerprint)
      idem_written = true
    end
    call('XADD', K[1], '*', 'e', ev .. stamp)
  end

  local d, n = {code, ra, rb, replayed}, 4
  if code ~= IDEMPOTENCY_REUSED then
    for i = 1, n_bucket do
      local tat = s[bf[i]] or 0
      n = n + 1
      d[n] = tat > now_us and tat - now_us or 0
    end
    for i = 1, n_window do
      local entries = ws[i]
      local sum
      if entries then
        sum = 0
        for j = 1, #entries, 2 do sum = sum + (tonumber(match(entries[j], ':(%d+)$')) or 1) end
      else
        sum, entries = window(wk[i], wp[i])
      end
      d[n + 1] = math.max(0, wc[i] - sum)
      d[n + 2] = entries[2] and ceil(tonumber(entries[2]) + wp[i] - now) or 0
      n = n + 2
    end
    for i = 1, n_quota do
      n = n + 1
      d[n] = used[qk[i]]
    end
  end
  out[dn + 3] = d
end

-- Write back: one HSET per state hash. It expires after the longest idle time of the
-- buckets written (a bucket written now is full by then: a missing field is a full
-- bucket), and never earlier than it was to (GT; NX when it had no expiry: a new hash).
for hash, dh in pairs(dirty) do
  local s, w, wn = st[hash], {}, 0
  for f in pairs(dh) do
    w[wn + 1] = f; w[wn + 2] = fmt('%d', s[f]); wn = wn + 2
  end
  call('HSET', hash, unpack(w, 1, wn))
  local at = fmt('%d', ceil((now_us + idle[hash]) / 1000) + 1000)
  if call('PEXPIREAT', hash, at, 'GT') == 0 then call('PEXPIREAT', hash, at, 'NX') end
end
for key, e in pairs(qexp) do
  call('SET', key, used[key], 'PXAT', e)
end
if idem_written then
  call('PEXPIREAT', idem_cur, fmt('%d', (idem_b + 2) * idem_w))
end
return out
