-- void: the effect did not happen (refused upstream, or proven never to have fired);
-- release everything the hold charges.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload, and
--          with an allowance the agent's kept answer bytes (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  retention_ms for the settled record (0 keeps it)
-- ARGV[3]  outcome: the upstream's answer to keep for repeats ('' for none)
-- ARGV[4..6] agent, short outcome, allowance: as post.lua's (a refusal's answer is
--          kept as long as an effect's, and costs the agent nothing of its budget)
-- ARGV[7]  optional '1': void only if the hold's deadline has passed (a
--          reconciler's "not found" proves nothing while a forward or a retry of
--          the effect may still be on its way; retry.lua moves the deadline)
--
-- Returns {status, state, flags}
--   'ok'         voided now (from pending, ambiguous or escalated); flags
--                `body_omitted` when the short outcome was kept
--   'exists'     already voided
--   'conflict'   the hold is posted, rejected, expired or denied (state names it)
--   'not_due'    due_only, and the deadline has not passed; nothing written
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: pending falls by exactly the hold's amounts; posted is untouched; the
-- agent's count of kept answer bytes never passes its allowance.

local id, retention_ms, outcome, allowance = settle_args()
if not id then return retention_ms end
local due_only = ARGV[7] == '1'
if #ARGV ~= 6 and not (#ARGV == 7 and due_only) then
  return {'bad_input', 'arguments',
    'void takes a hold id, retention, outcome, agent, short, allowance, [due_only 1]'}
end
local hold = load_hold(id)
if not hold then return {'not_found', '', ''} end
if hold.st == 'voided' then return {'exists', 'voided', ''} end
if hold.st ~= 'pending' and hold.st ~= 'ambiguous' and hold.st ~= 'escalated' then
  return {'conflict', hold.st, ''}
end
if due_only and hold.deadline > now_ms() then return {'not_due', hold.st, ''} end

local release = pending_release(hold)
add_balances(hold.accounts, release, zeros(#hold.accounts))
local kept, short = kept_within(outcome, allowance)
set_state(id, hold.st, 'voided', retention_ms, settle_fields(hold.st, kept, retention_ms, {}),
  hold.cr)
journal({'op', 'void', 'hold', id, 'st', 'voided',
         'd', deltas(hold.accounts, release, zeros(#hold.accounts))})
return {'ok', 'voided', short and 'body_omitted' or ''}
