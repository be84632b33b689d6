-- ambiguous: the effect may have happened (timeout, 5xx, reset after sending, a
-- crash): keep it charged until a reconciler learns the outcome.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  reason (a short code such as upstream_timeout)
-- ARGV[3]  optional claim, as retry.lua returned it: the claimer's send ended
--          ambiguous again, so its claim ends. Only that claim: a retry that outlived
--          its claim cannot end another's live one; without it no claim is touched
--
-- Returns {status, state, flags}
--   'ok'         ambiguous now; flags `late` when the hold had expired and is
--                charged again (the world may have changed after the release)
--   'exists'     already ambiguous (a retry's send ended ambiguous again: its claim,
--                if ARGV[3] names the live one, is cleared so the next repeat may send)
--   'conflict'   the hold is escalated, posted, voided, rejected or denied
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: an ambiguous hold charges its full amounts as pending and never
-- expires; only post or void ends it.

local id, err = hold_id_arg()
if not id then return err end
local why = ARGV[2]
if not valid_id(why) or #ARGV < 2 or #ARGV > 3 then
  return {'bad_input', 'reason', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
local claim = ARGV[3] or ''
local hold = load_hold(id)
if not hold then return {'not_found', '', ''} end
if hold.st == 'ambiguous' then
  if claim ~= '' and redis.call('HGET', hkey(id), 'rc') == claim then
    redis.call('HDEL', hkey(id), 'rc')
  end
  return {'exists', 'ambiguous', ''}
end
if hold.st ~= 'pending' and hold.st ~= 'expired' then
  return {'conflict', hold.st, ''}
end

local n = #hold.accounts
local charge, flag = zeros(n), ''
if hold.st == 'expired' then
  charge, flag = hold.amounts, 'late'
  add_balances(hold.accounts, charge, zeros(n))
  redis.call('PERSIST', hkey(id))
  redis.call('PERSIST', pkey(id)) -- the reconciler needs it
end
set_state(id, hold.st, 'ambiguous', 0, {'amb', why, 'flag', flag}, hold.cr)
journal({'op', 'ambiguous', 'hold', id, 'st', 'ambiguous', 'why', why, 'flag', flag,
         'd', deltas(hold.accounts, charge, zeros(n))})
return {'ok', 'ambiguous', flag}
