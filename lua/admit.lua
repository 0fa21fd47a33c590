-- admit.lua: takes one or more admission decisions, each all-or-nothing, in one call.
--
-- Every key of a call carries the hash tag of one shard ({N}), so the call touches one
-- Redis Cluster slot. The clock is Redis TIME. Decisions of a call are taken one after the
-- other; a decision sees what the ones before it consumed.
--
-- KEYS[1]   the shard's outbox stream
-- KEYS[2..] the keys of each decision, in the order its arguments name them (below)
--
-- ARGV[1..14], the call header (names as read below):
--   decisions                     number of decisions
--   m_start, m_next, m_end        month bounds, ms since the epoch: start of the current
--                                 month, start of the next month, end of the next month
--   m_label, m_next_label         labels of the current and the next month ("YYYY-MM")
--   m_expiry, m_next_expiry       expiry (ms since the epoch) of quota counters of the
--                                 current / next month
--   d_start, d_next, d_end        day bounds (as for months)
--   d_expiry, d_next_expiry       expiry of quota counters of the current / next day
--   tag                           the shard's key start ("<prefix>{N}:"), for the void
--                                 marks of void.lua
--
-- Then per decision (a cursor walks ARGV and KEYS):
--   event_id, org, has_idem (0/1), fingerprint (of the units), idem_ttl (ms),
--   n_rate, n_quota, n_conc, lease_ttl (ms), head, middle, tail (of the event JSON)
--   keys: idempotency record (if has_idem), lease record (if n_conc > 0)
--   The idempotency record is "<event id> <period> <fingerprint>\n<attempts>": the event
--   ids of the requests that were answered with this decision (the first and each replay)
--   and not voided since (void.lua). A record without "\n" (older) has one attempt, its own.
--   per rate limit:  algo ('b' bucket, 'w' sliding window), amount,
--                    param: rate per ms (b) or window ms (w), cap: burst (b) or limit (w),
--                    ttl: idle TTL ms (b)
--                    key: bucket state string (b) or window sorted set (w)
--   per quota:       amount, quota (-1 counts without capping), kind: period ('m' or 'd')
--                    keys: counter of the current period, counter of the next period
--   per concurrency: cap; key: lease sorted set
--
-- Reply: {CLOCK_OFF, sec, usec} when TIME is outside the bounds given (the caller's clock
-- is off: it recomputes the bounds from sec and calls again); otherwise
-- {DECIDED, sec, usec, d_1, ...} with per decision {code, a, b, replayed, state...}:
--   ALLOWED:            a = event id, b = period label charged
--   RATE_LIMITED:       a = index of the blocking limit (rate limits first, then
--                       concurrency), b = retry after, ms (-1: never at this size)
--   OVER_QUOTA:         a = index of the blocking quota, b = its period label
--   IDEMPOTENCY_REUSED: the idempotency key was used before with other units
-- state: per rate limit {remaining, ms until whole}, per quota {used}; after the charge
-- when allowed, as found when denied.
--
-- The contract with Go (pkg/admission/admitter.go): each block of arguments is read once,
-- by one `local <names> = unpack(ARGV, ...)` marked "-- layout: <block>", and the reply
-- codes are the capitalised locals marked "-- layout: reply". Go declares the same names
-- in the same order, and TestScriptLayout (pkg/admission) parses this file to compare.

-- layout: reply
local CLOCK_OFF, DECIDED = 0, 1
local ALLOWED, RATE_LIMITED, OVER_QUOTA, IDEMPOTENCY_REUSED = 1, 2, 3, 4

local UNDECIDED = 0 -- a decision's code while its checks run; never replied

local time = redis.call('TIME')
local sec, usec = tonumber(time[1]), tonumber(time[2])
local now = sec * 1000 + usec / 1000

-- layout: call
local decisions, m_start, m_next, m_end, m_label, m_next_label, m_expiry, m_next_expiry,
  d_start, d_next, d_end, d_expiry, d_next_expiry, tag = unpack(ARGV, 1, 14)
local a, k = 15, 2 -- cursors into ARGV and KEYS: the first decision's
m_start, m_next, m_end = tonumber(m_start), tonumber(m_next), tonumber(m_end)
d_start, d_next, d_end = tonumber(d_start), tonumber(d_next), tonumber(d_end)
if now < m_start or now >= m_end or now < d_start or now >= d_end then
  return {CLOCK_OFF, sec, usec}
end
local m_i = now >= m_next and 2 or 1
local d_i = now >= d_next and 2 or 1
local period = m_i == 2 and m_next_label or m_label
local expiry = {m = tonumber(m_i == 2 and m_next_expiry or m_expiry),
  d = tonumber(d_i == 2 and d_next_expiry or d_expiry)}

local stamp = rfc3339(sec, usec) -- from clock.lua, prepended

-- String keys read once per call (MGET), and the state parsed from them. Buckets and
-- counters are written back once, at the end, however many decisions changed them.
local loaded = {}   -- key -> raw value, or false when absent
local buckets = {}  -- key -> {tokens, ts, ttl, dirty}
local counters = {} -- key -> {used, expiry, dirty}

local function preload(keys)
  local missing, seen = {}, {}
  for _, k in ipairs(keys) do
    if loaded[k] == nil and not seen[k] then
      missing[#missing + 1] = k
      seen[k] = true
    end
  end
  if #missing > 0 then
    local vals = redis.call('MGET', unpack(missing))
    for i, k in ipairs(missing) do loaded[k] = vals[i] end
  end
end

local function bucket(key, rate, burst)
  local b = buckets[key]
  if not b then
    b = {tokens = burst, ts = now}
    local raw = loaded[key]
    if raw then
      local t, s = string.match(raw, '^(%S+) (%S+)$')
      t, s = tonumber(t), tonumber(s)
      if t and s then b.tokens, b.ts = t, s end
    end
    buckets[key] = b
  end
  if now > b.ts then
    b.tokens = b.tokens + (now - b.ts) * rate
    b.ts = now
  end
  if b.tokens > burst then b.tokens = burst end -- full, or the burst was lowered
  return b
end

local function counter(key, kind)
  local c = counters[key]
  if not c then
    c = {used = tonumber(loaded[key] or '0') or 0, expiry = expiry[kind]}
    counters[key] = c
  end
  return c
end

-- window returns the units in the sliding window at key and its entries (member, score)
-- oldest first. A member is "<event id>:<amount>".
local function window(key, width)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. (now - width))
  local entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local sum = 0
  for i = 1, #entries, 2 do
    sum = sum + (tonumber(string.match(entries[i], ':(%d+)$')) or 1)
  end
  return sum, entries
end

local out = {DECIDED, sec, usec}

for _ = 1, tonumber(decisions) do
  -- layout: decision
  local event_id, org, has_idem, fingerprint, idem_ttl, n_rate, n_quota, n_conc, lease_ttl,
    head, middle, tail = unpack(ARGV, a, a + 11)
  a = a + 12
  has_idem, idem_ttl, lease_ttl = has_idem == '1', tonumber(idem_ttl), tonumber(lease_ttl)
  n_rate, n_quota, n_conc = tonumber(n_rate), tonumber(n_quota), tonumber(n_conc)
  local idem_key, lease_key
  if has_idem then idem_key = KEYS[k]; k = k + 1 end
  if n_conc > 0 then lease_key = KEYS[k]; k = k + 1 end

  -- Parse the limits, and read every string key of the decision in one MGET.
  local rates, quotas, concs, reads = {}, {}, {}, {}
  if idem_key then reads[1] = idem_key end
  for i = 1, n_rate do
    -- layout: rate
    local algo, amount, param, cap, ttl = unpack(ARGV, a, a + 4)
    a = a + 5
    local r = {algo = algo, amount = tonumber(amount), param = tonumber(param),
      cap = tonumber(cap), ttl = tonumber(ttl), key = KEYS[k]}
    rates[i] = r
    if algo == 'b' then reads[#reads + 1] = r.key end
    k = k + 1
  end
  for i = 1, n_quota do
    -- layout: quota
    local amount, quota, kind = unpack(ARGV, a, a + 2)
    a = a + 3
    local idx = kind == 'd' and d_i or m_i
    local q = {amount = tonumber(amount), quota = tonumber(quota), kind = kind,
      key = KEYS[k + idx - 1], label = kind == 'd' and '' or period}
    quotas[i] = q
    reads[#reads + 1] = q.key
    k = k + 2
  end
  for i = 1, n_conc do
    -- layout: conc
    local cap = unpack(ARGV, a, a + 0)
    a = a + 1
    concs[i] = {cap = tonumber(cap), key = KEYS[k]}
    k = k + 1
  end
  preload(reads)

  -- Idempotency: a key seen before returns the first decision and charges nothing, and
  -- this request becomes one more attempt of it. A decision voided since (every attempt
  -- unanswered: void.lua) is forgotten: the request is decided afresh.
  local code, ra, rb, replayed = UNDECIDED, '', '', 0
  if idem_key and loaded[idem_key] then
    local head, attempts = string.match(loaded[idem_key], '^([^\n]*)\n?(.*)$')
    local id, p, fp = string.match(head, '^(%S+) (%S+) (.*)$')
    if redis.call('EXISTS', tag .. 'v:' .. id) == 1 then
      loaded[idem_key] = false
    elseif fp == fingerprint then
      code, ra, rb, replayed = ALLOWED, id, p, 1
      if attempts == '' then attempts = id end
      local record = head .. '\n' .. attempts .. ' ' .. event_id
      redis.call('SET', idem_key, record, 'KEEPTTL')
      loaded[idem_key] = record
    else
      code = IDEMPOTENCY_REUSED
    end
  end

  -- Check every limit before consuming anything: rate limits and concurrency (429, the
  -- longest wait wins), then quotas (402, the highest level wins).
  local sums = {}
  if code == UNDECIDED then
    local worst, worst_retry = 0, 0
    for i, r in ipairs(rates) do
      local retry = nil
      if r.algo == 'b' then
        local b = bucket(r.key, r.param, r.cap)
        if r.amount > b.tokens then
          retry = r.amount > r.cap and -1 or math.ceil((r.amount - b.tokens) / r.param)
        end
      else
        local sum, entries = window(r.key, r.param)
        sums[i] = {sum, entries}
        if sum + r.amount > r.cap then
          retry = -1
          if r.amount <= r.cap then
            local freed = 0
            for j = 1, #entries, 2 do
              freed = freed + (tonumber(string.match(entries[j], ':(%d+)$')) or 1)
              if sum - freed + r.amount <= r.cap then
                retry = math.max(1, math.ceil(tonumber(entries[j + 1]) + r.param - now))
                break
              end
            end
          end
        end
      end
      if retry and (worst == 0 or worst_retry >= 0 and (retry < 0 or retry > worst_retry)) then
        worst, worst_retry = i, retry
      end
    end
    for i, c in ipairs(concs) do
      redis.call('ZREMRANGEBYSCORE', c.key, '-inf', now)
      if redis.call('ZCARD', c.key) >= c.cap then
        local first = redis.call('ZRANGE', c.key, 0, 0, 'WITHSCORES')
        local retry = first[2] and math.max(1, math.min(1000, math.ceil(tonumber(first[2]) - now))) or 1000
        if worst == 0 or worst_retry >= 0 and retry > worst_retry then
          worst, worst_retry = n_rate + i, retry
        end
      end
    end
    if worst > 0 then
      code, ra, rb = RATE_LIMITED, worst, worst_retry
    else
      for i, q in ipairs(quotas) do
        local c = counter(q.key, q.kind)
        if q.quota >= 0 and c.used + q.amount > q.quota then
          code, ra, rb = OVER_QUOTA, i, q.label
          break
        end
      end
    end
  end

  -- All passed: consume everything, take the leases, remember the idempotency key and
  -- write the usage event to the outbox, all in this script.
  if code == UNDECIDED then
    code, ra, rb = ALLOWED, event_id, period
    for i, r in ipairs(rates) do
      if r.algo == 'b' then
        local b = buckets[r.key]
        b.tokens = b.tokens - r.amount
        b.ttl, b.dirty = r.ttl, true
      else
        redis.call('ZADD', r.key, now, event_id .. ':' .. r.amount)
        redis.call('PEXPIRE', r.key, math.ceil(r.param) + 1000)
        sums[i] = nil -- read again below, with this entry
      end
    end
    if n_conc > 0 then
      local held = {}
      for i, c in ipairs(concs) do
        redis.call('ZADD', c.key, now + lease_ttl, event_id)
        redis.call('PEXPIRE', c.key, lease_ttl)
        held[i] = c.key
      end
      redis.call('SET', lease_key, table.concat(held, ' '), 'PX', lease_ttl)
    end
    for _, q in ipairs(quotas) do
      local c = counters[q.key]
      c.used = c.used + q.amount
      c.dirty = true
    end
    if idem_key then
      local record = event_id .. ' ' .. period .. ' ' .. fingerprint .. '\n' .. event_id
      redis.call('SET', idem_key, record, 'PX', idem_ttl)
      loaded[idem_key] = record
    end
    redis.call('XADD', KEYS[1], '*', 'k', org, 'v', head .. stamp .. middle .. period .. tail)
  end

  local d = {code, ra, rb, replayed}
  if code ~= IDEMPOTENCY_REUSED then
    for i, r in ipairs(rates) do
      if r.algo == 'b' then
        local b = bucket(r.key, r.param, r.cap)
        d[#d + 1] = math.floor(b.tokens)
        d[#d + 1] = math.ceil((r.cap - b.tokens) / r.param)
      else
        local s = sums[i]
        if not s then s = {window(r.key, r.param)} end
        d[#d + 1] = math.max(0, r.cap - s[1])
        d[#d + 1] = s[2][2] and math.ceil(tonumber(s[2][2]) + r.param - now) or 0
      end
    end
    for _, q in ipairs(quotas) do
      d[#d + 1] = counter(q.key, q.kind).used
    end
  end
  out[#out + 1] = d
end

for key, b in pairs(buckets) do
  if b.dirty then
    redis.call('SET', key, string.format('%.17g %.17g', b.tokens, b.ts), 'PX', b.ttl)
  end
end
for key, c in pairs(counters) do
  if c.dirty then
    redis.call('SET', key, c.used, 'PXAT', c.expiry)
  end
end
return out
