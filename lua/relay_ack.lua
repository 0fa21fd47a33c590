-- relay_ack.lua: acknowledges the outbox entries a relay produced to Kafka and trims the
-- stream below the oldest entry not yet acknowledged, in one call. XTRIM MINID costs a
-- fraction of XDEL of the same ids (docs/admission.md, "Performance").
--
-- Only what the whole group has acknowledged goes: an entry below the bound is either
-- acknowledged or still pending for some consumer (XREADGROUP delivers in id order, and
-- next is past this relay's last delivered entry), and the bound is lowered to the oldest
-- pending entry (XPENDING summary), which may belong to another relay, or be one XAUTOCLAIM
-- will hand over. Entries never delivered are all above the group's last delivered id. An
-- entry not produced is never deleted.
--
-- KEYS[1]   the outbox stream
-- ARGV[1]   group: the relays' consumer group
-- ARGV[2]   next: the id just after the highest id acknowledged here ("<ms>-<seq + 1>"),
--           or "0-0" when none is
-- ARGV[3]   full: "1" to trim, when nothing is pending, up to the group's last delivered
--           entry (XINFO GROUPS: entries other relays acknowledged above next); the relay
--           asks for it when idle and after taking over entries, not per batch
-- ARGV[4..] the ids produced (none: trim only)
-- Returns the number of entries trimmed.
local stream, group, bound, full = KEYS[1], ARGV[1], ARGV[2], ARGV[3] == '1'
if #ARGV > 3 then redis.call('XACK', stream, group, unpack(ARGV, 4)) end
local pending = redis.call('XPENDING', stream, group)
if pending[1] > 0 then
  local low = pending[2]
  local lm, ls = string.match(low, '^(%d+)-(%d+)$')
  local bm, bs = string.match(bound, '^(%d+)-(%d+)$')
  lm, ls, bm, bs = tonumber(lm), tonumber(ls), tonumber(bm), tonumber(bs)
  if lm < bm or lm == bm and ls < bs then bound = low end
elseif full then
  -- Nothing pending: everything the group was delivered is acknowledged (other relays'
  -- entries above next included), so the bound is just past its last delivered entry.
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    if f['name'] == group then
      local m, q = string.match(f['last-delivered-id'], '^(%d+)-(%d+)$')
      if m then bound = m .. '-' .. string.format('%d', tonumber(q) + 1) end
    end
  end
end
return redis.call('XTRIM', stream, 'MINID', bound)
