-- pools: rewrite the open sets of a tenant's pooling routes (_lib.lua's `~<tag>|n/s/q`)
-- from its open holds, for a set left out of step with them (a gateway from before
-- the count closing a counted hold during an upgrade: docs/operations.md). A script
-- touches only declared keys, so the caller names the open holds it read (a hold
-- opened or closed since is caught: nothing is written and the reply says so).
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated (_lib.lua), then
--          KEYS[5+i] the record of hold ARGV[1+i], for i = 1..n
-- ARGV[1]  n (0..100000), then n hold ids: the tenant's pending and ambiguous holds
--
-- Returns
--   {'ok', routes}     the sets rewritten: `routes` the number of routes left with
--                      holds open (a route with none keeps no fields)
--   {'retry', ''}      the open holds are not the ones named: nothing written; read
--                      them again and call again
--   {'bad_input', field, message}   nothing written
--
-- Invariant: afterwards each route's count, face sum and sum of squares are those of
-- its open holds (pending or ambiguous, with `cr`), as the hold scripts keep them;
-- no balance, hold or journal entry changes (the sets are derived, not money).

local n = uint(ARGV[1], 100000)
if not n or #ARGV ~= 1 + n or #KEYS ~= 5 + n then
  return {'bad_input', 'holds', 'must name 0 to 100000 holds, each with its record key'}
end
local named = {}
for i = 1, n do
  local id = ARGV[1 + i]
  if not valid_id(id) or KEYS[5 + i] ~= hkey(id) or named[id] then
    return {'bad_input', 'holds', 'KEYS[5+i] must be the record of hold ARGV[1+i], once each'}
  end
  named[id] = true
end
-- The open holds now: the pending ones are in the deadline index (with the
-- escalated, which do not count), the ambiguous ones in their own set.
local open = {}
for _, id in ipairs(redis.call('ZRANGE', DEADLINES, '0', '-1')) do
  if redis.call('HGET', hkey(id), 'st') == 'pending' then
    open[#open + 1] = id
  end
end
for _, id in ipairs(redis.call('SMEMBERS', AMBIGUOUS)) do
  open[#open + 1] = id
end
if #open ~= n then
  return {'retry', ''}
end
for _, id in ipairs(open) do
  if not named[id] then
    return {'retry', ''}
  end
end

local sets, tags = {}, {}
for _, id in ipairs(open) do
  local cr = redis.call('HGET', hkey(id), 'cr')
  if cr then
    local tag, face = string.match(cr, '^([^|]+)|(%d+)$')
    local v = tonumber(face)
    local set = sets[tag]
    if not set then
      set = {0, 0, 0}
      sets[tag] = set
      tags[#tags + 1] = tag
    end
    set[1], set[2], set[3] = set[1] + 1, set[2] + v, set[3] + v * v
  end
end
local stale = {}
for _, field in ipairs(redis.call('HKEYS', ACCOUNTS)) do
  if string.sub(field, 1, 1) == '~' then
    stale[#stale + 1] = field
  end
end
if #stale > 0 then
  redis.call('HDEL', ACCOUNTS, unpack(stale))
end
for _, tag in ipairs(tags) do
  local nf, sf, qf = pool_fields(tag)
  local set = sets[tag]
  redis.call('HSET', ACCOUNTS, nf, fmt(set[1]), sf, fmt(set[2]), qf, string.format('%.17g', set[3]))
end
return {'ok', #tags}
