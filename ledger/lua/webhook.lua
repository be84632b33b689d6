-- webhook: one dispatcher at a time delivers a tenant's webhook events, and only the
-- lease's holder moves the tenant's delivery cursor (a holder that lost its lease,
-- e.g. after a pause longer than the lease, can no longer move it).
--
-- KEYS     accounts, journal (_lib.lua), then KEYS[3] the lease
--          `irrev:{<tenant>}:webhook:lease` (its holder's id, with a TTL) and KEYS[4]
--          the cursor `irrev:{<tenant>}:webhook:cursor` (a journal entry id)
-- ARGV[1]  'hold' (take the lease if free, or renew it if ours), 'advance' (move the
--          cursor, if the lease is ours) or 'release' (give the lease up, if ours)
-- ARGV[2]  the dispatcher's id
-- ARGV[3]  hold: the lease's ttl_ms (> 0); advance: the journal entry id delivered
--
-- Returns
--   {'ok', cursor}        hold: the lease is ours until now + ttl_ms; cursor is where
--                         delivery resumes (set to the journal's last entry, or 0-0,
--                         the first time: a new webhook hears of what happens next)
--                         advance: moved; release: released
--   {'conflict', holder}  the lease is someone else's (or nobody's, for advance and
--                         release); nothing written
--   {'bad_input', field, message}
--
-- Invariant: the cursor only moves forward, and only by the lease's holder.

local LEASE, CURSOR = KEYS[3], KEYS[4]
local action, me = ARGV[1], ARGV[2]
if not valid_id(me) then
  return {'bad_input', 'owner', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
local holder = redis.call('GET', LEASE)
if action == 'hold' then
  local ttl_ms = uint(ARGV[3], MAX_AMOUNT)
  if not ttl_ms or ttl_ms == 0 then return {'bad_input', 'ttl_ms', 'must be an integer > 0'} end
  if holder and holder ~= me then return {'conflict', holder} end
  redis.call('SET', LEASE, me, 'PX', ttl_ms)
  local cursor = redis.call('GET', CURSOR)
  if not cursor then
    local last = redis.call('XREVRANGE', JOURNAL, '+', '-', 'COUNT', 1)
    cursor = last[1] and last[1][1] or '0-0'
    redis.call('SET', CURSOR, cursor)
  end
  return {'ok', cursor}
end
if holder ~= me then return {'conflict', holder or ''} end
if action == 'release' then
  redis.call('DEL', LEASE)
  return {'ok', ''}
end
if action ~= 'advance' then return {'bad_input', 'action', 'must be hold, advance or release'} end
local ms, seq = string.match(ARGV[3] or '', '^(%d+)%-(%d+)$')
if not ms then return {'bad_input', 'cursor', 'must be a journal entry id'} end
local now = redis.call('GET', CURSOR) or '0-0'
local now_ms, now_seq = string.match(now, '^(%d+)%-(%d+)$')
if tonumber(ms) > tonumber(now_ms) or (ms == now_ms and tonumber(seq) > tonumber(now_seq)) then
  redis.call('SET', CURSOR, ARGV[3])
end
return {'ok', redis.call('GET', CURSOR)}
