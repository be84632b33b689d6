-- attach: which hold a call that carries no idempotency key of its own is, when it
-- is keyed by its content (the agent, the route and the request as priced). One
-- content has a sequence of holds, generations 1, 2, ...: a repeat attaches to the
-- newest one while that is live or settled within the route's dedupe window, and
-- opens the next generation only after it (or after a denial, which held nothing).
-- The caller derives every generation's hold id itself (ledger/keys.py), asks here
-- about the one it believes newest and reserves the id it is told.
--
-- KEYS     accounts (the tenant's, for `bind`: not read), then
-- KEYS[2]  the content's index: the newest generation handed out (a string)
-- KEYS[3]  the record of generation ARGV[1]'s hold (`...:hold:<id>`)
-- KEYS[4]  `...:settled`, the tenant's settled index (archive.lua)
-- ARGV[1]  g, the generation asked about (>= 1)
-- ARGV[2]  window_ms: how long after its hold settled a repeat still attaches
-- ARGV[3]  index_ttl_ms: how long the index outlives its last use (> 0)
--
-- Returns
--   {'attach', g}   generation g's hold is live (escalated, pending, ambiguous) or
--                   ended at most window_ms ago as posted (the effect happened), or
--                   rejected or expired (a person's decision, or none in time):
--                   reserve its id, which replays it
--   {'free', g}     no hold of generation g exists: reserve its id to open it (racing
--                   callers reserve the same id, so one opens it and the rest replay)
--   {'next', g+1}   generation g's hold was denied or voided (it held nothing, or its
--                   effect provably did not happen: a repeat is decided anew), or ended
--                   longer ago than the window: ask about g+1. Nothing written
--   {'ahead', n}    the index is at n > g: ask about n. Nothing written
--   {'archived', g} generation g's hold is settled and archived out of the slot:
--                   restore it (restore.lua) and ask again. Nothing written
--   {'bad_input', field, message}   nothing written
--
-- Invariant: a content's live hold is never passed over: 'next' is answered only for
-- a hold that ended past the window, was denied or was voided, so two holds of one content are
-- live at once only if the caller reserves a generation it was not told. The index
-- only rises; it is a hint (a missing index reads as 0 and the caller walks up).

local g = uint(ARGV[1], MAX_AMOUNT)
local window_ms = uint(ARGV[2], MAX_AMOUNT)
local index_ttl_ms = uint(ARGV[3], MAX_AMOUNT)
if not g or g < 1 then return {'bad_input', 'generation', 'must be an integer >= 1'} end
if not window_ms then return {'bad_input', 'window_ms', 'must be an integer >= 0'} end
if not index_ttl_ms or index_ttl_ms < 1 then
  return {'bad_input', 'index_ttl_ms', 'must be an integer >= 1'}
end
if #KEYS ~= 4 or #ARGV ~= 3 or KEYS[4] ~= P .. 'settled'
    or string.sub(KEYS[3], 1, #P + 5) ~= P .. 'hold:' then
  return {'bad_input', 'arguments', 'attach takes 4 keys (a hold record, then the '
    .. 'settled index) and 3 arguments'}
end

local index = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if index > g then return {'ahead', index} end

local h = redis.call('HMGET', KEYS[3], 'st', 'tp', 'te')
local st = h[1]
if not st then
  -- Its id is what follows `hold:` in its record's key.
  if archived_id(KEYS[4], string.sub(KEYS[3], #P + 6)) then
    return {'archived', g}
  end
end
local verdict = 'free'
if st == 'escalated' or st == 'pending' or st == 'ambiguous' then
  verdict = 'attach'
elseif st == 'denied' or st == 'voided' then
  return {'next', g + 1}
elseif st then
  -- A settled hold's end, by Redis's clock: its post (tp) or its other end (te).
  local ended = tonumber(h[2] or h[3] or '')
  if not ended or ended + window_ms < now_ms() then
    return {'next', g + 1}
  end
  verdict = 'attach'
end
if g > index then
  redis.call('SET', KEYS[2], fmt(g), 'PX', fmt(index_ttl_ms))
else
  redis.call('PEXPIRE', KEYS[2], fmt(index_ttl_ms))
end
return {verdict, g}
