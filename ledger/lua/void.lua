-- void: the effect did not happen (refused upstream, or proven never to have fired);
-- release everything the hold charges.
--
-- KEYS[1]  tenant key prefix `irrev:{<tenant>}:`
-- ARGV[1]  hold id
-- ARGV[2]  retention_ms for the settled record (0 keeps it)
-- ARGV[3]  outcome: the upstream's answer to keep for repeats ('' for none)
--
-- Returns {status, state, flags}
--   'ok'         voided now (from pending, ambiguous or escalated)
--   'exists'     already voided
--   'conflict'   the hold is posted, rejected, expired or denied (state names it)
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: pending falls by exactly the hold's amounts; posted is untouched.

local id, retention_ms, outcome = settle_args()
if not id then return retention_ms end
if #ARGV ~= 3 then return {'bad_input', 'arguments', 'void takes a hold id, retention, outcome'} end
local hold = load_hold(id)
if not hold then return {'not_found', '', ''} end
if hold.st == 'voided' then return {'exists', 'voided', ''} end
if hold.st ~= 'pending' and hold.st ~= 'ambiguous' and hold.st ~= 'escalated' then
  return {'conflict', hold.st, ''}
end

local release = pending_release(hold)
add_balances(hold.accounts, release, zeros(#hold.accounts))
set_state(id, hold.st, 'voided', retention_ms, settle_fields(outcome, {}))
journal({'op', 'void', 'hold', id, 'st', 'voided',
         'd', deltas(hold.accounts, release, zeros(#hold.accounts))})
return {'ok', 'voided', ''}
