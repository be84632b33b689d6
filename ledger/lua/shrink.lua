-- shrink: a hold's charge lowered, never raised: the stress margin of a hold priced
-- while its route's burst detector was off (pricing/stress.py), released once the
-- detector vouches for it (gateway/state/margins.py). Until then the hold charged
-- its stressed price, so it was admitted only where that price fit.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  the most the hold charges each of its accounts from now: an integer >= 0
--          (an account it charges less keeps its amount)
--
-- A live hold (pending, ambiguous, escalated) has its amounts and its accounts'
-- pending lowered. A posted one that nobody has trued up or compensated yet (its
-- charge is still its price, not what the world did) has its posted amounts and
-- its accounts' posted lowered too, where the account's window is still the one
-- it was posted in (an earlier window's charge has rolled off already).
--
-- Returns {status, state, flags}
--   'ok'         lowered (state unchanged)
--   'exists'     it charged no more than that already: nothing written
--   'conflict'   the hold is settled: voided, rejected, expired, denied, or posted
--                and trued up or compensated (flags: `settled`): its charge is final
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: pending and posted each fall by exactly what the hold's own amounts on
-- them fall, and nothing rises; the hold's state and deadline are untouched, so a
-- later post, void, expiry or true-up settles what it charges now.

local id, err = hold_id_arg()
if not id then return err end
local most = uint(ARGV[2], MAX_AMOUNT)
if not most or #ARGV ~= 2 then
  return {'bad_input', 'amount', 'must be an integer in [0, 2^53-1]'}
end
local hold = load_hold(id)
if not hold then return {'not_found', '', ''} end
local live = hold.st == 'pending' or hold.st == 'ambiguous' or hold.st == 'escalated'
if not live and hold.st ~= 'posted' then
  return {'conflict', hold.st, ''}
end
if hold.st == 'posted' and redis.call('HEXISTS', hkey(id), 'cmp') == 1 then
  return {'conflict', 'posted', 'settled'}
end

local n = #hold.accounts
local lowered, posted, changed = {}, {}, false
for i = 1, n do
  lowered[i] = math.min(hold.amounts[i], most)
  posted[i] = live and 0 or math.min(hold.posted[i], most)
  changed = changed or lowered[i] ~= hold.amounts[i] or (not live and posted[i] ~= hold.posted[i])
end
if not changed then return {'exists', hold.st, ''} end

-- Only now, with something to write: roll() journals a renewed window.
local dpend, dpost, accounts = zeros(n), zeros(n), nil
if live then
  for i = 1, n do
    dpend[i] = lowered[i] - hold.amounts[i]
  end
else
  local now = now_ms()
  accounts = load_accounts(hold.accounts)
  for i = 1, n do
    local a = accounts[i]
    if a then
      roll(a, now)
      if a.ws == hold.post_ws[i] then
        dpost[i] = posted[i] - hold.posted[i]
        a.post = a.post + dpost[i]
      end
    end
  end
end
if live then
  add_balances(hold.accounts, dpend, dpost)
  redis.call('HSET', hkey(id), 'amt', join_numbers(lowered))
else
  save_accounts(accounts)
  redis.call('HSET', hkey(id), 'amt', join_numbers(lowered), 'pst', join_numbers(posted))
end
journal({'op', 'shrink', 'hold', id, 'st', hold.st, 'd', deltas(hold.accounts, dpend, dpost)})
return {'ok', hold.st, ''}
