-- account: create an account, or change its limit, soft band, window or approval
-- threshold. Balances are kept: changing a policy never forgives spending.
--
-- KEYS     accounts, journal (_lib.lua)
-- ARGV[1]  account id (kind:name)
-- ARGV[2]  limit, in the tenant's minor unit
-- ARGV[3]  soft limit: pending + posted above it escalates (= limit: no band)
-- ARGV[4]  window_ms: budgets renew every window, aligned to the epoch (0: never)
-- ARGV[5]  approval threshold: a single hold above it escalates (0: none)
-- ARGV[6]  optional: max escalations, how many of the holds that name this account
--          first among their agent accounts may wait for a human at once (0 or
--          none: no bound; reserve.lua); kept as the field `<id>|escmax`, not
--          journaled (no balance depends on it)
-- ARGV[7]  optional, after ARGV[6]: max new accounts, how many risk-factor accounts
--          the holds that name this (agent) account may open per window (0 or none:
--          no bound; reserve.lua), kept as `<id>|nfamax`, not journaled
-- ARGV[8], ARGV[9]  optional, after ARGV[7]: the account's rate for effects and for
--          reads, `<interval ms>,<slack ms>` ('' for none; _lib.lua's rate_step),
--          kept as `<id>|rte` and `|rtr` with the next arrival they had (a change of
--          policy does not let a burst through), not journaled
-- ARGV[10] optional, after ARGV[9]: the version of the tenant's policy (in the
--          fleet's policy store) these limits come from ('' or none: unversioned),
--          kept as `<id>|pv`, not journaled
--
-- Returns {status, state, flags}
--   'ok'         'created' or 'updated', or 'kept' when the account already holds
--                the limits of a newer policy version than ARGV[10] (nothing written)
--   'bad_input'  (state = field, flags = message)
--   {'escrowed'}  the tenant is split over escrow shards or is one (_lib.lua's
--                escrowed): nothing written
--
-- Invariant: soft limit <= limit; a new account starts with zero balances in the
-- current window; every change is journaled so replay knows the limits; an
-- account's limits never go back to an older policy version's (two hosts writing
-- two versions' limits in the wrong order: the older one is kept out); no account is
-- defined on an escrowed tenant, whose limits the escrow holds (escrow.lua).

if escrowed() then
  return {'escrowed'}
end
local account = ARGV[1]
if not valid_id(account) or not string.match(account, '^%a+:.') then
  return {'bad_input', 'account', 'must be kind:name of [A-Za-z0-9._:@/-], at most 128'}
end
local limit, soft = uint(ARGV[2], MAX_AMOUNT), uint(ARGV[3], MAX_AMOUNT)
local win, appr = uint(ARGV[4], MAX_AMOUNT), uint(ARGV[5], MAX_AMOUNT)
if not limit then return {'bad_input', 'limit', 'must be an integer in [0, 2^53-1]'} end
if not soft or soft > limit then return {'bad_input', 'soft_limit', 'must be between 0 and the limit'} end
if not win then return {'bad_input', 'window_ms', 'must be an integer >= 0'} end
if not appr then return {'bad_input', 'approval_threshold', 'must be an integer in [0, 2^53-1]'} end
local escmax = ARGV[6] and uint(ARGV[6], MAX_AMOUNT)
if ARGV[6] and not escmax then
  return {'bad_input', 'max_escalations', 'must be an integer >= 0'}
end
local nfamax = ARGV[7] and uint(ARGV[7], MAX_AMOUNT)
if ARGV[7] and not nfamax then
  return {'bad_input', 'max_new_accounts', 'must be an integer >= 0'}
end
local paces = {}
for j, name in ipairs({'rte', 'rtr'}) do
  local text = ARGV[7 + j]
  local interval, slack = string.match(text or '', '^(%d+),(%d+)$')
  if text and text ~= '' and not (uint(interval, MAX_AMOUNT) and uint(slack, MAX_AMOUNT)
      and tonumber(interval) > 0) then
    return {'bad_input', 'rate', 'must be <interval ms>,<slack ms> with an interval above 0'}
  end
  -- false, not nil: pairs() below must meet it, to remove a rate the policy dropped
  paces[name] = interval and interval .. ',' .. slack or false
end
local pv = ARGV[10] and ARGV[10] ~= '' and uint(ARGV[10], MAX_AMOUNT)
if ARGV[10] and ARGV[10] ~= '' and not pv then
  return {'bad_input', 'policy_version', 'must be an integer >= 0'}
end
if #ARGV < 5 or #ARGV > 10 then
  return {'bad_input', 'arguments', 'account takes five to ten arguments'}
end

local now = now_ms()
local ws = 0
if win > 0 then
  ws = now - (now % win)
end
local outcome = 'updated'
local a = load_account(account)
if a and pv and (tonumber(redis.call('HGET', ACCOUNTS, field(account, 'pv'))) or 0) > pv then
  return {'ok', 'kept', ''}
end
if a then
  roll(a, now)
  if win == a.win then
    ws = a.ws
  end
else
  outcome = 'created'
  a = {id = account, pend = 0, post = 0, over = 0}
end
a.limit, a.soft, a.win, a.appr, a.ws = limit, soft, win, appr, ws
a.policy = true
save_accounts({a})
-- The bounds of an agent's account: set when given above 0, else gone.
for name, bound in pairs({escmax = escmax or 0, nfamax = nfamax or 0}) do
  if bound > 0 then
    redis.call('HSET', ACCOUNTS, field(account, name), fmt(bound))
  else
    redis.call('HDEL', ACCOUNTS, field(account, name))
  end
end
for name, pace in pairs(paces) do
  if pace then
    local tat = string.match(redis.call('HGET', ACCOUNTS, field(account, name)) or '', ',(%d+)$')
    redis.call('HSET', ACCOUNTS, field(account, name), pace .. ',' .. (tat or '0'))
  else
    redis.call('HDEL', ACCOUNTS, field(account, name))
  end
end
if pv then redis.call('HSET', ACCOUNTS, field(account, 'pv'), fmt(pv)) end
journal({'op', 'account', 'acct', account, 'limit', fmt(limit), 'soft', fmt(soft),
         'win', fmt(win), 'appr', fmt(appr), 'ws', fmt(ws)})
return {'ok', outcome, ''}
