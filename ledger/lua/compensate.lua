-- compensate: part of a posted effect was recovered (refund, cancellation); give
-- the recovered part back to the budget and record the realised loss.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  retention_ms for the record (0 keeps it; the clock restarts)
-- ARGV[3]  '*' then ARGV[4] the recovered amount for every account, or
--          n then n pairs (account id, recovered amount)
--
-- Returns {status, state, flags}
--   'ok'         recovered amounts recorded; flags lists `rolled_off` when an
--                account's window has renewed since the post (the posted amount
--                already left its balance, so nothing more is returned there)
--   'conflict'   the hold is not posted
--   'not_found', 'bad_input' (recovering more than posted minus compensated is
--                bad input; state = field, flags = message)
--
-- Invariant: an account's posted balance never falls by more than this hold
-- posted to it in the current window.

local id, err = hold_id_arg()
if not id then return err end
local retention_ms
retention_ms, err = retention_arg()
if not retention_ms then return err end
local hold = load_hold(id)
if not hold then return {'not_found', '', ''} end
local recovered
recovered, err = amounts_for(hold, 3)
if not recovered then return err end
if hold.st ~= 'posted' then return {'conflict', hold.st, ''} end
for i = 1, #hold.accounts do
  if recovered[i] > hold.posted[i] - hold.compensated[i] then
    return {'bad_input', 'amount', 'recovers more than the hold posted and has not yet recovered'}
  end
end

local now = now_ms()
local n = #hold.accounts
local dpost, total, flag = zeros(n), {}, ''
local accounts = load_accounts(hold.accounts)
reopen_closed(id, hold.accounts, accounts, now)
for i = 1, n do
  local a = accounts[i]
  roll(a, now)
  if a.ws == hold.post_ws[i] then
    dpost[i] = -recovered[i]
    a.post = a.post + dpost[i]
  else
    flag = 'rolled_off'
  end
  total[i] = hold.compensated[i] + recovered[i]
end
save_accounts(accounts)
redis.call('HSET', hkey(id), 'cmp', join_numbers(total))
keep_settled(id, retention_ms)
journal({'op', 'compensate', 'hold', id, 'st', 'posted', 'flag', flag,
         'rec', join_numbers(recovered), 'd', deltas(hold.accounts, zeros(n), dpost)})
return {'ok', 'posted', flag}
