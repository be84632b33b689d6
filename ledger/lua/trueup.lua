-- trueup: a posted effect's realised residual is known (compensation done, return
-- window closed); the hold's net charge (posted minus compensated) becomes exactly
-- that. What it charged above returns to the budget, as a compensation does; a
-- realised residual above it is posted on top and, above what the hold held,
-- flagged as an overrun (contract 1's exception: the world did it).
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  retention_ms for the record (0 keeps it; the clock restarts)
-- ARGV[3]  the realised residual, the same for every account of the hold
--
-- Returns {status, state, flags}
--   'ok'         the net charge is the realised residual now; flags lists
--                `overrun` and `rolled_off` (an account's window renewed since the
--                post: nothing is returned there; a rise is charged to the new one)
--   'exists'     it already was; the hold's st is set again to 'posted' (see below)
--   'conflict'   the hold is not posted
--   'not_found', 'bad_input' (state = field, flags = message; a rise that would
--                take an account's pending + posted past 2^53-1 is bad input,
--                checked before any write)
--
-- Invariant: an account's posted balance falls by at most what this hold posted to
-- it in the current window, and rises by exactly the rise of the hold's net charge.
-- A replay ('exists') writes nothing but re-sets one field to its own value, so that
-- its caller's WAIT covers the settlement it replays (WAIT / WAITAOF count the writes
-- of their own connection; the re-set is propagated after the true-up or post).

local id, err = hold_id_arg()
if not id then return err end
local retention_ms
retention_ms, err = retention_arg()
if not retention_ms then return err end
local realised = uint(ARGV[3], MAX_AMOUNT)
if not realised or #ARGV ~= 3 then
  return {'bad_input', 'amount', 'must be an integer in [0, 2^53-1]'}
end
local hold = load_hold(id)
if not hold then return {'not_found', '', ''} end
if hold.st ~= 'posted' then return {'conflict', hold.st, ''} end

local now = now_ms()
local n = #hold.accounts
local accounts, changed = load_accounts(hold.accounts), false
for i = 1, n do
  local a = accounts[i]
  local rise = realised - (hold.posted[i] - hold.compensated[i])
  if rise > 0 and a and a.pend + posted_after_roll(a, now) + rise > MAX_AMOUNT then
    return {'bad_input', 'amount', 'would take ' .. a.id .. ' past 2^53-1'}
  end
  changed = changed or rise ~= 0
end
if not changed then
  redis.call('HSET', hkey(id), 'st', 'posted')
  return {'exists', 'posted', ''}
end

local held_flags = redis.call('HGET', hkey(id), 'flag') or ''
local overrun = string.find(',' .. held_flags .. ',', ',overrun,', 1, true) ~= nil
local dpost, posted, compensated, flags = zeros(n), {}, {}, {}
reopen_closed(id, hold.accounts, accounts, now)
for i = 1, n do
  local a = accounts[i]
  roll(a, now)
  local rise = realised - (hold.posted[i] - hold.compensated[i])
  posted[i] = math.max(hold.posted[i], realised)
  compensated[i] = posted[i] - realised
  if rise > 0 then
    dpost[i] = rise
  elseif a.ws == hold.post_ws[i] then
    dpost[i] = rise
  elseif rise < 0 then
    flags.rolled_off = true
  end
  a.post = a.post + dpost[i]
  if rise > 0 and realised > hold.amounts[i] then
    flags.overrun = true
    a.over = a.over + 1
  end
end
save_accounts(accounts)
local reported = {}
if flags.overrun then reported[#reported + 1] = 'overrun' end
if flags.rolled_off then reported[#reported + 1] = 'rolled_off' end
local kept = held_flags
if flags.overrun and not overrun then
  kept = held_flags == '' and 'overrun' or held_flags .. ',overrun'
end
redis.call('HSET', hkey(id), 'pst', join_numbers(posted), 'cmp', join_numbers(compensated),
  'flag', kept)
keep_settled(id, retention_ms)
local flag_text = table.concat(reported, ',')
journal({'op', 'trueup', 'hold', id, 'st', 'posted', 'flag', flag_text,
         'real', fmt(realised), 'd', deltas(hold.accounts, zeros(n), dpost)})
return {'ok', 'posted', flag_text}
