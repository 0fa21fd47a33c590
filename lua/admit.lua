-- admit.lua: takes one or more admission decisions, each all-or-nothing, in one call.
--
-- Every key of a call carries the hash tag of one shard ({N}), so the call touches one
-- Redis Cluster slot. The clock is Redis TIME. Decisions of a call are taken one after the
-- other; a decision sees what the ones before it consumed.
--
-- Cost is what this script is written for (docs/admission.md, "Performance"): globals are
-- made locals once, no table per limit, no float formatting, an account's limits read once
-- per call from the policy mirror, one HMGET of the org's state hash and one MGET of the
-- quota counters per decision at most (none when an earlier decision of the call read
-- them), writes once at the end of the call.
--
-- KEYS[1]    the shard's outbox stream
-- KEYS[1+d]  the state hash of decision d's org ("<tag>s:<org>"): one field per token
--            bucket, "<account>:<unit letter>" -> the bucket's theoretical arrival time
--            (GCRA), integer µs since the epoch; the bucket is full when it is <= now. The
--            hash expires when its latest bucket is full again (a missing field is a full
--            bucket). The org's policy mirror is "<tag>p:<org>" beside it.
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
--                                 lease records, idempotency buckets and filters
--   lease_ttl                     ms a concurrency lease is held without an outcome
--   idem_h, idem_ttl              the hot window H and the idempotency TTL, ms (see
--                                 "Idempotency" below)
--   idem_legacy                   the bucket width of the layout before hot buckets, ms:
--                                 its records ("<tag>i:<floor(now / w)>" and the bucket
--                                 before) are looked up too; "" not
--   qchan                         the channel told (PUBLISH <queue key>) when a waiter
--                                 leaves a queue: the next one may go
--
-- Then per decision (a cursor walks ARGV):
--   event_id; pfield, the account's program in the org's mirror (its version, then the
--   account); inline, the program itself when Go is not sure the mirror holds it (the
--   mirror then keeps it), else ""; idem (field of the idempotency record, "" without a
--   key); fingerprint (a short hash of the units and tool); u_r, u_t, u_c, u_m (the amounts
--   of requests, tokens, credits, cost_micros); ev (the compact usage event up to the
--   policy's fields, see internal/admission/event.go); flags, four characters "0" or "1":
--   shadow (shadow mode, see "Shadow" below), replay (1: a replay is answered with the
--   first decision and becomes one more attempt of it; 0: a replay is refused,
--   REPLAY_REFUSED, and nothing is written: a gateway would serve it again, unbilled),
--   wait (a wait record follows), logged (the billing log has no admission of the key);
--   nexts (per alert rule of the program, "," separated: the thresholds are looked at
--   when the counter is at least next, or the balance below it; -1 not at all); bloom (the
--   key's positions in the idempotency filters, " " separated; "" without a billing log)
--   wait record:         wait (ms the request may still wait), ticket (its id), member
--                        and tq (its place in a queue and that queue's key, "" when not
--                        queued)
--
-- Programs (internal/admission/limits.go): what an account's decisions check, derived by Go
-- from the policy, a MessagePack array read in blocks ("-- layout:" below) once per call:
-- prio (the account's priority, 0-100), id_tail (".<shard>.<org>": how event ids of the
-- org end), ev_static (the compact event's policy fields), the record counts, tiered (1: a
-- tier record follows each bucket record), then the records. A unit is 1-4 (requests,
-- tokens, credits, cost_micros): a limit whose unit the request does not carry is left
-- out, as Go's plan leaves it out when it reads the reply. The mirror field's version is a
-- hash of the program: every node with the same policy reads and writes the same field,
-- one with another policy its own; a field the mirror does not hold (a new policy, a wiped
-- or failed-over Redis) is never guessed at: the decision is answered MIRROR_MISS, having
-- done nothing, and Go sends it again with the program inline. The mirror expires
-- MIRROR_TTL after a program was last sent inline (Go sends each again hourly).
--   per token bucket:    field; emission (µs per unit: inc = amount × emission, rounded
--                        up); win = burst × emission interval, µs; unit. The bucket is
--                        the level's spare: its limit less what it reserves for its
--                        children's guarantees.
--   then per token bucket when tiered (buckets come unit by unit, each unit's from the
--   account up to the org, a "chain"):
--                        up: 0 the chain's last, 1 the next bucket is the level above,
--                        2 and this level's guaranteed traffic is reserved there;
--                        cfield, cemission, cwin: the ceiling's bucket ("" for none);
--                        label: "<account>:<unit>", what the event records (with
--                        "=<amount>") when the level borrows
--   per sliding window:  key, width (ms), limit, unit
--   per quota:           prefix (the counter's key but for its period label), quota (-1
--                        counts without capping), kind: period ('m' or 'd'), unit
--   per concurrency:     key (lease sorted set), cap
--   per credit:          gkey (the hash of an account's grants of a unit: grant id →
--                        remaining units), tkey (their terms: grant id → "<priority>|
--                        <effective ms>|<expires ms, 0 never>"), label
--                        ("<account>:<unit>", how the event names the draws), unit
--   per alert rule:      ref (i > 0: the program's quota record i, i < 0: its credit
--                        record -i), list (the thresholds, "<units>:<spec>,…" ascending;
--                        spec names one: "p80", "b5000", "bp20"), label ("<account>:<unit>")
--
-- Idempotency (docs/admission.md "Idempotency"): the record of a key is
--   "<event id> <period> <fingerprint>\n<attempts>": the event ids of the requests that
--   were answered with this decision (the first and each replay) and not voided since
--   (void.lua). A record without "\n" has one attempt, its own. An event id written
--   "~<uuid>" (the head's and the attempts') is "<uuid><id_tail>" (records are scoped by
--   account, so by org: the tail is the reader's too). A record holds at most
--   MAX_ATTEMPTS attempts: a replay past them is refused (IDEMPOTENCY_EXHAUSTED), so a
--   record's size and the time to rewrite it stay bounded however often a key is
--   replayed. Records live in hot buckets "<tag>h:<floor(now / H)>", looked up in the
--   current one and the one before. With a billing log (bloom given), H is short and the
--   buckets looked up go back to the one holding the shard's mark ("<tag>h:mark", ms:
--   every event admitted before it is in the log; the whole TTL without a mark), and each
--   key admitted sets its bits in the filter "<tag>f:<floor(now / (TTL / 2))>": a key no
--   hot bucket holds whose bits are all set in one of the last three filters is answered
--   CHECK_LOG, having done nothing, unless logged (Go looked it up and the log has no
--   admission of it). Without a log, H is the TTL.
--
-- Outbox: the events of a call are appended in one entry, after the call's writes: a lone
-- event as the field "e" (a usage event, compact: internal/wire) or "a" (a threshold event);
-- several as the field "E", each "<kind><length>:<body>" (kind "e" or "a", length in
-- bytes), in the order the decisions took them. One XADD per call instead of one per
-- event: about a third of the cost per event (docs/admission.md, "Performance").
--
-- Guarantees (docs/admission.md "Guarantees and borrowing"): a chain is walked from the
-- account up. Traffic a child sends within its guarantee arrives reserved and passes the
-- parent's spare unchecked; other traffic takes the level's spare bucket or, past it and
-- when the level has a ceiling, the ceiling's bucket: the level borrows and its traffic
-- arrives unreserved at the level above, which must have spare for it.
--
-- Credits (docs/credits.md): a request draws each credit record's amount from the grants
-- drawable now (effective <= TIME < expires, remaining > 0), highest priority first, then
-- the earliest expiry, then the grant id; less than the amount in all of them refuses it.
--
-- Alerts (docs/alerts.md): a threshold fires in the call whose request crosses it: a quota
-- counter reaching it (or, for a threshold at the quota, the first request the quota
-- refuses), a balance going from at or more to below it. Each fires once: a quota's
-- thresholds per counter (so per period), marked in the hash "<counter>|a" (spec -> 1,
-- expiring with the counter); a balance's per arming grant, the latest grant effective
-- (greatest effective time, then id), marked in "<grants>|a" (spec -> that grant): a
-- top-up re-arms it, a refund does not. Go leaves out of next the quota thresholds it saw
-- reached (their decision had them), so most decisions compare one number per rule. A firing appends an entry to the outbox
-- after the request's usage event: "a" = "<ev><sec>|<usec>|<period>|<label>|<spec>|<at>|
-- <value>|<window>|<admitted>" (window: the counter's period label, or the arming grant;
-- value: the counter after the request, before it when refused, or the balance after it).
--
-- Shadow (docs/admission.md "Shadow mode"): a decision in shadow mode that would be refused
-- (429 or 402) is admitted instead, and the refusal is reported. Like a refused request it
-- takes no rate capacity (buckets, ceilings, windows, slots); like an admitted one it is
-- billed: its quotas are charged, past them if need be, and its credits drawn when every
-- balance covers it (else none). Its usage event ends with a sixteenth field, the refusal
-- ("rate_limited", "quota_exceeded", "insufficient_balance").
--
-- Queues (docs/admission.md "Waiting for capacity"): each limit has a queue, a sorted set
-- ("<tag>k:<bucket field>", "<window key>|q", "<lease set>|q") scored class × 2^40 + seq
-- (class = 100 - priority, seq from "<tag>kn"), members "<seq>:<deadline ms>:<ticket>". The state hash's field "q"
-- holds the latest deadline of a waiter of the org: before it, every limit's queue is
-- consulted, and a request behind a live waiter is refused by that limit. A request that
-- may wait and is refused joins (or keeps its place in) the refusing limit's queue.
--
-- Reply: {CLOCK_OFF, sec, usec} when TIME is outside the bounds given (the caller's clock
-- is off: it recomputes the bounds from sec and calls again); otherwise
-- {DECIDED, sec, usec, d_1, ...} with per decision {code, a, b, replayed, queued, shadowed,
-- state...} (queued: "" or "<queue key> <member> <1 at the head, else 0>"; shadowed: "" or
-- "<code> <a> <b>", the refusal shadow mode admitted):
--   ALLOWED:            a = event id, b = period label charged
--   RATE_LIMITED:       a = index of the blocking limit (buckets, then windows, then
--                       concurrency), b = retry after, ms (-1: never at this size; 1000
--                       when a waiter is ahead)
--   OVER_QUOTA:         a = index of the blocking quota, b = its period label
--   INSUFFICIENT_BALANCE: a = index of the credit record, b = the balance it had
--   IDEMPOTENCY_REUSED: the idempotency key was used before with other units
--   REPLAY_REFUSED:     a replay where replay is 0; a = the first decision's event id
--   IDEMPOTENCY_EXHAUSTED: a replay of a record that holds MAX_ATTEMPTS attempts
--   MIRROR_MISS:        the mirror does not hold the program (see "Programs"): nothing done
--   CHECK_LOG:          the key may be in the billing log (see "Idempotency"): nothing done
-- state, integers: per bucket µs until it is full, per window {remaining, ms until clear},
-- per quota {used}, per credit {balance, -1 when not read}; after the charge when allowed,
-- as found when denied. Go derives the
-- RateLimit fields from them and the policy it holds.
--
-- The contract with Go (internal/admission/encode.go, limits.go, reply.go): each block of
-- arguments or of a program is read once, by one `local <names> = unpack(A, ...)` (P for a
-- program) marked "-- layout: <block>", and the reply codes
-- are the capitalised locals marked "-- layout: reply". Go declares the same names in the
-- same order, and TestScriptLayout (internal/admission) parses this file to compare.

-- layout: reply
local CLOCK_OFF, DECIDED = 0, 1
local ALLOWED, RATE_LIMITED, OVER_QUOTA, IDEMPOTENCY_REUSED, INSUFFICIENT_BALANCE = 1, 2, 3, 4, 5
local REPLAY_REFUSED, IDEMPOTENCY_EXHAUSTED, MIRROR_MISS, CHECK_LOG = 6, 7, 8, 9

-- MAX_ATTEMPTS bounds the attempts an idempotency record holds (see above).
local MAX_ATTEMPTS = 16
-- MAX_COUNTER is the largest value a quota counter may take, capped or not: 2^53 - 1, the
-- largest integer a Lua number holds exactly. A request that would take a counter past it
-- is refused (OVER_QUOTA), in shadow mode too, so that counters stay exact integers.
local MAX_COUNTER = 9007199254740991
-- MAX_MICROS bounds a bucket's inc (amount × emission interval, µs): about 31 years, so
-- that a TAT stays an exact integer.
local MAX_MICROS = 1000000000000000
-- MIRROR_TTL is how long an org's policy mirror lives after a program was last sent
-- inline, ms (Go sends it again hourly: see "Programs" above).
local MIRROR_TTL = 86400000

local A, K, call, tonumber, unpack, fmt, match, sub = ARGV, KEYS, redis.call, tonumber, unpack, string.format, string.match, string.sub
local floor, ceil, pairs, gmatch, gsub, decode = math.floor, math.ceil, pairs, string.gmatch, string.gsub, cmsgpack.unpack

-- short writes an event id of the org as a record holds it: "~<uuid>" for "<uuid><id_tail>".
local function short(id, tail)
  local n = #id - #tail
  if n > 0 and tail ~= '' and sub(id, n + 1) == tail then return '~' .. sub(id, 1, n) end
  return id
end

local time = call('TIME')
local sec, usec = time[1], time[2]
local now_us = tonumber(sec) * 1000000 + tonumber(usec)
local now = now_us / 1000 -- ms

-- layout: call
local decisions, lo, hi, m_next, m_label, m_next_label, m_expiry, m_next_expiry, d_next, d_label,
  d_next_label, d_expiry, d_next_expiry, tag, lease_ttl, idem_h, idem_ttl, idem_legacy, qchan = unpack(A, 1, 19)
local a = 20 -- cursor into ARGV: the first decision's
if now < tonumber(lo) or now >= tonumber(hi) then
  return {CLOCK_OFF, tonumber(sec), tonumber(usec)}
end
local period, m_exp = m_label, m_expiry
if now >= tonumber(m_next) then period, m_exp = m_next_label, m_next_expiry end
local day, d_exp = d_label, d_expiry
if now >= tonumber(d_next) then day, d_exp = d_next_label, d_next_expiry end
lease_ttl, idem_h, idem_ttl = tonumber(lease_ttl), tonumber(idem_h), tonumber(idem_ttl)
local idem_b, idem_lo, idem_cur -- the hot buckets to look in (lo to b), named at the first key
local idem_written = false
local filt_g, filt_written -- the filter generation, named at the first key with positions
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
local tu, tcf, tci, tcw, tb, ct, bb       -- tier: up, ceiling field, inc, win, borrow, new TAT, borrowed
local gk, gt, ga, gl, gb, gd              -- credit: grants, terms, amount, label, balance, draws
local xr, xn, xs, xl                      -- alert: ref, next, list, label
local CLASS = 2 ^ 40                      -- a queue score's class unit

-- head returns the first live member of queue qkey and its score, dropping (and telling)
-- waiters whose deadline has passed.
local function head(qkey)
  for _ = 1, 16 do
    local h = call('ZRANGE', qkey, 0, 0, 'WITHSCORES')
    if not h[1] then return nil end
    if tonumber(match(h[1], '^%d+:(%d+):')) >= now then return h[1], tonumber(h[2]) end
    call('ZREM', qkey, h[1])
    call('PUBLISH', qchan, qkey)
  end
  return nil
end

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

-- The grants of a call, read once per grants hash and kept in drawing order: gc[gkey] =
-- {n, ids, rem, prio, exp} for the grants drawable now with units left (the clock does not
-- move during a call). Draws change rem here and add to gw[gkey][id]; the hash is written
-- once per grant at the end of the call (HINCRBY).
local gc, gw = {}, {}
local function grants(gkey, tkey)
  local g = gc[gkey]
  if g then return g end
  local rem, terms = call('HGETALL', gkey), call('HGETALL', tkey)
  local tm = {}
  for j = 1, #terms, 2 do tm[terms[j]] = terms[j + 1] end
  local ids, rs, ps, xs, n = {}, {}, {}, {}, 0
  for j = 1, #rem, 2 do
    local id, r, t = rem[j], tonumber(rem[j + 1]), tm[rem[j]]
    if r and r > 0 and t then
      local p, e, x = match(t, '^(%d+)|(%d+)|(%d+)$')
      p, e, x = tonumber(p), tonumber(e), tonumber(x)
      if p and e <= now and (x == 0 or now < x) then
        if x == 0 then x = math.huge end
        -- Insertion in drawing order: priority down, then expiry, then id (a handful of
        -- grants: no sort with a comparator closure).
        local k = n
        while k > 0 and (ps[k] < p or ps[k] == p and (xs[k] > x or xs[k] == x and ids[k] > id)) do
          ids[k + 1], rs[k + 1], ps[k + 1], xs[k + 1] = ids[k], rs[k], ps[k], xs[k]
          k = k - 1
        end
        ids[k + 1], rs[k + 1], ps[k + 1], xs[k + 1] = id, r, p, x
        n = n + 1
      end
    end
  end
  g = {n = n, ids = ids, rem = rs, terms = terms}
  gc[gkey] = g
  return g
end

-- draw returns the balance of the grants in gkey drawable now and, when it covers amount,
-- the draws that take it: {grant index, units, ...} in drawing order (nothing is taken
-- yet: take does).
local function draw(gkey, tkey, amount)
  local g = grants(gkey, tkey)
  local rem, bal = g.rem, 0
  for j = 1, g.n do bal = bal + rem[j] end
  if bal < amount then return bal, false end
  local draws, dn, need = {}, 0, amount
  for j = 1, g.n do
    if need <= 0 then break end
    local r = rem[j]
    if r > 0 then
      local t = r < need and r or need
      draws[dn + 1], draws[dn + 2] = j, t
      dn, need = dn + 2, need - t
    end
  end
  return bal, draws
end
-- arming returns the grant that arms a balance's thresholds: of the grants in gkey's terms
-- effective now, the latest (greatest effective time, then id); "" for none.
local function arming(gkey)
  local t, best, be = gc[gkey].terms, '', -1
  for j = 1, #t, 2 do
    local e = tonumber(match(t[j + 1], '^%d+|(%d+)|'))
    if e and e <= now and (e > be or e == be and t[j] > best) then best, be = t[j], e end
  end
  return best
end

-- The call's events, in order: kind ('e' a usage event, 'a' a threshold event) and body.
-- They go to the outbox in one entry at the end of the call (see "Outbox" above).
local ek, eb, en = {}, {}, 0

-- fire appends the threshold event of alert record i's threshold at (units), named spec,
-- to the call's events (see "Alerts" above).
local function fire(ev, i, spec, at, value, window, admitted)
  en = en + 1
  ek[en], eb[en] = 'a', ev .. stamp .. '|' .. xl[i] .. '|' .. spec .. '|' .. at .. '|' ..
    fmt('%d', value) .. '|' .. window .. '|' .. (admitted and '1' or '0')
end

local out = {DECIDED, tonumber(sec), tonumber(usec)}
local progs, mirrors = {}, {} -- per call: program field -> parsed program; state hash -> mirror
local ba, ta = {}, {}          -- the program's bucket j -> its place among the decision's, or false
local same = {}                -- the program and amounts the limits arrays hold now
local n_bucket, n_tier, n_window, n_quota, n_conc, n_credit, n_alert -- the decision's records

for dn = 1, tonumber(decisions) do repeat
  -- layout: decision
  local event_id, pfield, inline, idem, fingerprint, u_r, u_t, u_c, u_m, ev, flags, nexts,
    bloom = unpack(A, a, a + 12)
  a = a + 13
  local hash = K[1 + dn]
  local shadow, replay, n_wait, logged = sub(flags, 1, 1), sub(flags, 2, 2), sub(flags, 3, 3), sub(flags, 4, 4)
  local wait, ticket, member, tq = 0, '', '', ''
  if n_wait == '1' then
    -- layout: wait
    local w, t, m, q = unpack(A, a, a + 3)
    a = a + 4
    wait, ticket, member, tq = tonumber(w), t, m, q
  end

  -- The account's program: parsed once per call, from the mirror or sent inline (which
  -- the mirror then keeps). A version the mirror does not hold is not guessed at.
  local P = progs[pfield]
  if not P then
    local mk = mirrors[hash]
    if not mk then mk = tag .. 'p:' .. sub(hash, #tag + 3); mirrors[hash] = mk end
    local src = inline
    if src == '' then
      src = call('HGET', mk, pfield)
    else
      call('HSET', mk, pfield, src)
      call('PEXPIRE', mk, MIRROR_TTL)
    end
    if src then P = decode(src); progs[pfield] = P end
  end
  if not P then
    out[dn + 3] = {MIRROR_MISS, '', '', 0, '', ''}
    break
  end

  -- Read the limits the units touch; fetch the state not read yet by this call. A
  -- decision of the same program and amounts as the one before it (a burst of one
  -- account) takes the same limits: they are read once.
  -- layout: program
  local prio, id_tail, ev_static, pn_bucket, tiered, pn_window, pn_quota, pn_conc, pn_credit,
    pn_alert = unpack(P, 1, 10)
  local p = 11 -- cursor into P
  ev = ev .. ev_static
  local s = st[hash]
  if P == same.P and u_r == same.r and u_t == same.t and u_c == same.c and u_m == same.m and nexts == same.x then
    n_bucket, n_tier, n_window, n_quota, n_conc, n_credit, n_alert = same.nb, same.nt, same.nw, same.nq, same.nc, same.ncr, same.na
    for i = 1, n_tier do bb[i] = false end
    for i = 1, n_window do ws[i] = false end
    for i = 1, n_credit do gb[i], gd[i] = -1, false end
  else
    local amt = {tonumber(u_r), tonumber(u_t), tonumber(u_c), tonumber(u_m)}
    local miss, mn = nil, 0
    if not s then s = {q = false}; st[hash] = s; miss, mn = {'q'}, 1 end
    n_bucket = 0
    for j = 1, pn_bucket do
      -- layout: bucket
      local field, emission, win, unit = unpack(P, p, p + 3)
      p = p + 4
      local amount = amt[unit]
      if amount ~= 0 then
        n_bucket = n_bucket + 1
        local inc = ceil(amount * emission)
        if inc > MAX_MICROS then inc = MAX_MICROS end
        bf[n_bucket], bi[n_bucket], bw[n_bucket], ba[j], ta[j] = field, inc, win, n_bucket, amount
        if s[field] == nil then
          if not miss then miss = {} end
          mn = mn + 1; miss[mn] = field; s[field] = false
        end
      else
        ba[j] = false
      end
    end
    n_tier = 0
    if tiered == 1 then
      n_tier = n_bucket
      if n_tier > 0 and not tu then tu, tcf, tci, tcw, tb, ct, bb = {}, {}, {}, {}, {}, {}, {} end
      for j = 1, pn_bucket do
        -- layout: tier
        local up, cfield, cemission, cwin, label = unpack(P, p, p + 4)
        p = p + 5
        local i = ba[j]
        if i then
          local cinc = 0
          if cfield ~= '' then
            cinc = ceil(ta[j] * cemission)
            if cinc > MAX_MICROS then cinc = MAX_MICROS end
            label = label .. '=' .. fmt('%d', ta[j])
            if s[cfield] == nil then
              if not miss then miss = {} end
              mn = mn + 1; miss[mn] = cfield; s[cfield] = false
            end
          end
          tu[i], tcf[i], tci[i], tcw[i], tb[i], bb[i] = up, cfield, cinc, cwin, label, false
        end
      end
    end
    if mn > 0 then
      local v = call('HMGET', hash, unpack(miss, 1, mn))
      for i = 1, mn do s[miss[i]] = tonumber(v[i]) or false end
    end
    if pn_window > 0 and not wk then wk, wa, wp, wc, ws = {}, {}, {}, {}, {} end
    n_window = 0
    for _ = 1, pn_window do
      -- layout: window
      local key, width, limit, unit = unpack(P, p, p + 3)
      p = p + 4
      local amount = amt[unit]
      if amount ~= 0 then
        n_window = n_window + 1
        wk[n_window], wa[n_window], wp[n_window], wc[n_window], ws[n_window] = key, amount, width, limit, false
      end
    end
    miss, mn = nil, 0
    n_quota = 0
    local qi = {} -- qi: the program's quota j -> its place among the decision's
    for j = 1, pn_quota do
      -- layout: quota
      local prefix, quota, kind, unit = unpack(P, p, p + 3)
      p = p + 4
      local amount = amt[unit]
      if amount ~= 0 then
        n_quota = n_quota + 1
        qi[j] = n_quota
        local daily = kind == 'd'
        local key = prefix .. (daily and day or period)
        qk[n_quota], qa[n_quota], qc[n_quota], qd[n_quota] = key, amount, quota, daily
        if used[key] == nil then
          if not miss then miss = {} end
          mn = mn + 1; miss[mn] = key; used[key] = 0
        end
      end
    end
    if mn > 0 then
      local v = call('MGET', unpack(miss, 1, mn))
      for i = 1, mn do used[miss[i]] = tonumber(v[i]) or 0 end
    end
    n_conc = pn_conc
    if n_conc > 0 and not ck then ck, cc = {}, {} end
    for i = 1, n_conc do
      -- layout: conc
      local key, cap = unpack(P, p, p + 1)
      p = p + 2
      ck[i], cc[i] = key, cap
    end
    if pn_credit > 0 and not gk then gk, gt, ga, gl, gb, gd = {}, {}, {}, {}, {}, {} end
    n_credit = 0
    local ci = {} -- ci: the program's credit j -> its place among the decision's
    for j = 1, pn_credit do
      -- layout: credit
      local gkey, tkey, label, unit = unpack(P, p, p + 3)
      p = p + 4
      local amount = amt[unit]
      if amount > 0 then
        n_credit = n_credit + 1
        ci[j] = n_credit
        gk[n_credit], gt[n_credit], ga[n_credit], gl[n_credit], gb[n_credit], gd[n_credit] = gkey, tkey, amount, label, -1, false
      end
    end
    n_alert = 0
    if pn_alert > 0 then
      if not xr then xr, xn, xs, xl = {}, {}, {}, {} end
      local nx, k = {}, 0
      for x in gmatch(nexts, '[^,]+') do k = k + 1; nx[k] = tonumber(x) end
      for j = 1, pn_alert do
        -- layout: alert
        local ref, list, label = unpack(P, p, p + 2)
        p = p + 3
        local r
        if ref > 0 then r = qi[ref] else r = ci[-ref]; r = r and -r end
        if r and nx[j] and nx[j] >= 0 then
          n_alert = n_alert + 1
          xr[n_alert], xn[n_alert], xs[n_alert], xl[n_alert] = r, nx[j], list, label
        end
      end
    end

    same.P, same.r, same.t, same.c, same.m, same.x = P, u_r, u_t, u_c, u_m, nexts
    same.nb, same.nt, same.nw, same.nq, same.nc, same.ncr, same.na = n_bucket, n_tier, n_window, n_quota, n_conc, n_credit, n_alert
  end

  -- Idempotency: a key seen before returns the first decision and charges nothing, and
  -- this request becomes one more attempt of it. A decision voided since (every attempt
  -- unanswered: void.lua) is forgotten: the request is decided afresh, without asking the
  -- billing log, which may hold the voided admission before its void. A key no hot bucket
  -- holds that a filter may hold is looked up in the billing log by Go first (CHECK_LOG;
  -- "Idempotency" above).
  local code, ra, rb, replayed = 0, '', '', 0 -- 0: undecided while the checks run
  if idem ~= '' then
    if not idem_b then
      idem_b = floor(now / idem_h)
      idem_cur, idem_lo = tag .. 'h:' .. idem_b, idem_b - 1
      if bloom ~= '' then
        -- Records stay from the bucket holding the shard's mark on (all of the TTL when
        -- there is none): their events may not be in the billing log yet.
        local mark, oldest = tonumber(call('GET', tag .. 'h:mark')), floor((now - idem_ttl) / idem_h)
        local lo = mark and floor(mark / idem_h) or oldest
        if lo < oldest then lo = oldest end
        if lo < idem_lo then idem_lo = lo end
      end
    end
    local where, rec, forgotten = nil, nil, false
    for b = idem_b, idem_lo, -1 do
      where = b == idem_b and idem_cur or tag .. 'h:' .. b
      rec = call('HGET', where, idem)
      if rec then break end
    end
    if not rec and idem_legacy ~= '' then
      local lb = floor(now / tonumber(idem_legacy))
      for b = lb, lb - 1, -1 do
        where = tag .. 'i:' .. b
        rec = call('HGET', where, idem)
        if rec then break end
      end
    end
    if rec then
      local head, attempts = match(rec, '^([^\n]*)\n?(.*)$')
      local id, per, fp = match(head, '^(%S+) (%S+) (.*)$')
      if sub(id, 1, 1) == '~' then id = sub(id, 2) .. id_tail end
      if call('EXISTS', tag .. 'v:' .. id) == 1 then
        rec, forgotten = false, true
      elseif fp == fingerprint then
        if attempts == '' then attempts = short(id, id_tail) end
        local _, held = gsub(attempts, '%S+', '')
        if replay ~= '1' then
          code, ra = REPLAY_REFUSED, id
        elseif held >= MAX_ATTEMPTS then
          code = IDEMPOTENCY_EXHAUSTED
        else
          code, ra, rb, replayed = ALLOWED, id, per, 1
          call('HSET', where, idem, head .. '\n' .. attempts .. ' ' .. short(event_id, id_tail))
        end
      else
        code = IDEMPOTENCY_REUSED
      end
    end
    if not rec and not forgotten and bloom ~= '' and logged ~= '1' then
      local g = floor(now / (idem_ttl / 2))
      local get = {}
      for x in gmatch(bloom, '%d+') do get[#get + 1] = 'GET'; get[#get + 1] = 'u1'; get[#get + 1] = x end
      for k = g, g - 2, -1 do
        local bits, all = call('BITFIELD_RO', tag .. 'f:' .. k, unpack(get)), true
        for i = 1, #bits do if bits[i] == 0 then all = false; break end end
        if all then
          out[dn + 3] = {CHECK_LOG, '', '', 0, '', ''}
          break
        end
      end
      if out[dn + 3] then break end
    end
  end

  -- Check every limit before consuming anything: rate limits and concurrency (429, the
  -- longest wait wins), then quotas (402, the highest level wins).
  local mine -- this request's score in its queue, if it is in one
  local queued, behind = '', false -- behind: refused for a waiter ahead
  local full = false -- a quota counter would pass MAX_COUNTER: refused in shadow mode too
  if code == 0 then
    local worst, worst_retry = 0, 0
    local reserved = false -- the traffic arriving at bucket i is a child's guarantee
    for i = 1, n_bucket do
      local tat, inc, win = s[bf[i]] or now_us, bi[i], bw[i]
      if tat < now_us then tat = now_us end
      tat = tat + inc
      bt[i] = tat
      local up, cf = 0, ''
      if n_tier > 0 then
        up, cf = tu[i], tcf[i]
        if cf ~= '' then
          local c = s[cf] or now_us
          if c < now_us then c = now_us end
          ct[i] = c + tci[i]
        end
      end
      local pass, borrowed = true, false
      if reserved then
        bt[i] = false -- reserved for the child: the spare is not touched
      elseif tat - now_us > win then
        if cf ~= '' and ct[i] - now_us <= tcw[i] then
          bt[i], borrowed = false, true -- past the guarantee, within the ceiling: borrow
        else
          pass = false
          local retry = inc > win and -1 or ceil((tat - now_us - win) / 1000)
          if cf ~= '' then
            local cinc, cwin = tci[i], tcw[i]
            local cretry = cinc > cwin and -1 or ceil((ct[i] - now_us - cwin) / 1000)
            if retry < 0 or cretry >= 0 and cretry < retry then retry = cretry end
          end
          if worst == 0 or worst_retry >= 0 and (retry < 0 or retry > worst_retry) then
            worst, worst_retry = i, retry
          end
        end
      end
      if n_tier > 0 then bb[i] = borrowed end
      reserved = pass and not borrowed and up == 2
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
    -- Queues: while the org has waiters, a request behind a live waiter of one of its
    -- limits is refused by that limit, whatever its capacity.
    local q = s.q
    if q and q >= now then
      if member ~= '' then mine = tonumber(call('ZSCORE', tq, member)) end
      -- Behind a head scored below limit: below its own score for a request in a queue,
      -- else below the next class (any waiter of its priority or higher).
      local limit = mine or (101 - tonumber(prio)) * CLASS
      local n = n_bucket + n_window + n_conc
      for i = 1, n do
        local qkey
        if i <= n_bucket then qkey = tag .. 'k:' .. bf[i]
        elseif i <= n_bucket + n_window then qkey = wk[i - n_bucket] .. '|q'
        else qkey = ck[i - n_bucket - n_window] .. '|q' end
        local hm, hs = head(qkey)
        if hm and hm ~= member and hs < limit then
          if worst == 0 then worst, worst_retry, behind = i, 1000, true end
          break
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
    for i = 1, n_quota do
      if used[qk[i]] + qa[i] > MAX_COUNTER then
        code, ra, rb, full = OVER_QUOTA, i, qd[i] and day or period, true
        break
      end
    end
    if code == 0 then
      for i = 1, n_credit do
        local bal, draws = draw(gk[i], gt[i], ga[i])
        gb[i], gd[i] = bal, draws
        if not draws then
          code, ra, rb = INSUFFICIENT_BALANCE, i, bal
          break
        end
      end
    end
  end

  -- Shadow: a refusal is reported and the request admitted (see "Shadow" above).
  local shadowed, refusal, rate = '', '', true -- rate: the rate limits are charged
  if shadow == '1' and not full and (code == RATE_LIMITED or code == OVER_QUOTA or code == INSUFFICIENT_BALANCE) then
    shadowed = code .. ' ' .. ra .. ' ' .. rb
    refusal = code == RATE_LIMITED and 'rate_limited' or code == OVER_QUOTA and 'quota_exceeded' or 'insufficient_balance'
    code, rate, behind = 0, false, false
    local all = true
    for i = 1, n_credit do
      local bal, draws = draw(gk[i], gt[i], ga[i])
      gb[i], gd[i] = bal, draws
      all = all and draws
    end
    if not all then
      for i = 1, n_credit do gd[i] = false end
    end
  end

  -- All passed: consume everything, take the leases, remember the idempotency key and
  -- write the usage event to the outbox, all in this script.
  if code == 0 then
    code, ra, rb = ALLOWED, event_id, period
    if n_bucket > 0 and rate then
      local dh = dirty[hash]
      if not dh then dh = {}; dirty[hash] = dh end
      local top = idle[hash] or 0
      for i = 1, n_bucket do
        local f = bf[i]
        if bt[i] then s[f] = bt[i]; dh[f] = true end
        if bw[i] > top then top = bw[i] end
        if n_tier > 0 and tcf[i] ~= '' then
          local cf = tcf[i]
          s[cf] = ct[i]; dh[cf] = true
          if tcw[i] > top then top = tcw[i] end
        end
      end
      idle[hash] = top
    end
    for i = 1, rate and n_window or 0 do
      call('ZADD', wk[i], now, event_id .. ':' .. wa[i])
      call('PEXPIRE', wk[i], ceil(wp[i]) + 1000)
      ws[i] = false -- read again below, with this entry
    end
    if n_conc > 0 and rate then
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
      call('HSET', idem_cur, idem, short(event_id, id_tail) .. ' ' .. period .. ' ' .. fingerprint)
      idem_written = true
      if bloom ~= '' then
        if not filt_g then filt_g = floor(now / (idem_ttl / 2)) end
        local set = {}
        for x in gmatch(bloom, '%d+') do set[#set + 1] = 'SET'; set[#set + 1] = 'u1'; set[#set + 1] = x; set[#set + 1] = 1 end
        call('BITFIELD', tag .. 'f:' .. filt_g, unpack(set))
        filt_written = true
      end
    end
    local borrowed = ''
    for i = 1, rate and n_tier or 0 do
      if bb[i] then borrowed = borrowed .. (borrowed == '' and '' or ',') .. tb[i] end
    end
    local credits = ''
    for i = 1, n_credit do
      local draws, g = gd[i], gc[gk[i]]
      if draws then
        local w = gw[gk[i]]
        if not w then w = {}; gw[gk[i]] = w end
        for j = 1, #draws, 2 do
          local k, t = draws[j], draws[j + 1]
          local id = g.ids[k]
          g.rem[k] = g.rem[k] - t
          w[id] = (w[id] or 0) + t
          credits = credits .. (credits == '' and '' or ',') .. gl[i] .. ':' .. id .. '=' .. fmt('%d', t)
        end
        gb[i] = gb[i] - ga[i]
      end
    end
    local tail = ''
    if refusal ~= '' then tail = '|' .. borrowed .. '|' .. credits .. '|' .. refusal
    elseif credits ~= '' then tail = '|' .. borrowed .. '|' .. credits
    elseif borrowed ~= '' then tail = '|' .. borrowed end
    en = en + 1
    ek[en], eb[en] = 'e', ev .. stamp .. tail
  end

  -- Alerts: the thresholds this request crossed fire, each once (see "Alerts" above).
  for i = 1, n_alert do
    local j = xr[i]
    if j > 0 then
      local key = qk[j]
      local val, refused = used[key], code == OVER_QUOTA and ra == j
      if refused or code == ALLOWED and replayed == 0 and val >= xn[i] then
        local marks = key .. '|a'
        for at, spec in gmatch(xs[i], '(%d+):([^,]+)') do
          local n = tonumber(at)
          if (refused and n >= qc[j] and val < n or not refused and val >= n) and call('HSETNX', marks, spec, 1) == 1 then
            call('PEXPIREAT', marks, qd[j] and d_exp or m_exp)
            fire(ev, i, spec, at, val, qd[j] and day or period, not refused)
          end
        end
      end
    elseif code == ALLOWED and replayed == 0 and gd[-j] then
      j = -j
      local bal = gb[j]
      if bal < xn[i] then
        local was, grant = bal + ga[j], nil
        for at, spec in gmatch(xs[i], '(%d+):([^,]+)') do
          local n = tonumber(at)
          if bal < n and was >= n then
            if not grant then grant = arming(gk[j]) end
            local marks = gk[j] .. '|a'
            if call('HGET', marks, spec) ~= grant then
              call('HSET', marks, spec, grant)
              fire(ev, i, spec, at, bal, grant, true)
            end
          end
        end
      end
    end
  end

  -- Waiting: a request that may wait and was refused by a rate or concurrency limit
  -- takes (or keeps) its place in that limit's queue, unless the wait cannot be enough.
  -- Any other end leaves the queue, and the next waiter is told.
  if wait > 0 and code == RATE_LIMITED and (behind or rb >= 0 and rb < wait) then
    local i = ra
    local qkey
    if i <= n_bucket then qkey = tag .. 'k:' .. bf[i]
    elseif i <= n_bucket + n_window then qkey = wk[i - n_bucket] .. '|q'
    else qkey = ck[i - n_bucket - n_window] .. '|q' end
    if member ~= '' and mine == nil then mine = tonumber(call('ZSCORE', tq, member)) end
    local deadline = ceil(now + wait)
    if mine == nil then
      mine = (100 - tonumber(prio)) * CLASS + call('INCR', tag .. 'kn')
      member = fmt('%d:%d:%s', mine % CLASS, deadline, ticket)
    elseif qkey ~= tq then
      call('ZREM', tq, member)
      call('PUBLISH', qchan, tq)
      member = fmt('%d:%d:%s', mine % CLASS, deadline, ticket)
    end
    call('ZADD', qkey, fmt('%d', mine), member)
    local at = fmt('%d', deadline + 1000)
    if call('PEXPIREAT', qkey, at, 'GT') == 0 then call('PEXPIREAT', qkey, at, 'NX') end
    if not s.q or s.q < deadline + 1000 then
      s.q = deadline + 1000
      local dh = dirty[hash]
      if not dh then dh = {}; dirty[hash] = dh end
      dh.q = true
      local w = (deadline + 1000 - now) * 1000
      if w > (idle[hash] or 0) then idle[hash] = w end
    end
    local h = call('ZRANGE', qkey, 0, 0)
    queued = qkey .. ' ' .. member .. ' ' .. (h[1] == member and 1 or 0)
  elseif member ~= '' then
    if call('ZREM', tq, member) == 1 then call('PUBLISH', qchan, tq) end
  end

  local d, n = {code, ra, rb, replayed, queued, shadowed}, 6
  if code ~= IDEMPOTENCY_REUSED and code ~= REPLAY_REFUSED and code ~= IDEMPOTENCY_EXHAUSTED then
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
    for i = 1, n_credit do
      n = n + 1
      d[n] = gb[i]
    end
  end
  out[dn + 3] = d
until true end

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
-- A hot bucket lives until its end plus the TTL at most (the relay's janitor deletes it
-- once the mark has passed it); a filter while a lookup may consult it.
if idem_written then
  call('PEXPIREAT', idem_cur, fmt('%d', (idem_b + 1) * idem_h + idem_ttl))
end
if filt_written then
  call('PEXPIREAT', tag .. 'f:' .. filt_g, fmt('%d', (filt_g + 1) * (idem_ttl / 2) + idem_ttl))
end
for gkey, w in pairs(gw) do
  for id, t in pairs(w) do
    call('HINCRBY', gkey, id, '-' .. fmt('%d', t))
  end
end
if en == 1 then
  call('XADD', K[1], '*', ek[1], eb[1])
elseif en > 1 then
  local e = {}
  for i = 1, en do e[i] = ek[i] .. #eb[i] .. ':' .. eb[i] end
  call('XADD', K[1], '*', 'E', table.concat(e, '', 1, en))
end
return out
