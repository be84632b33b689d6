-- reject: a human refuses an escalated effect; its budget returns. Consume-once
-- with approve: exactly one resolution wins.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  retention_ms for the settled record (0 keeps it)
-- ARGV[3]  rejecter id
-- ARGV[4]  optional note: why, in the rejecter's words (at most 2048 bytes), kept
--          with the hold for the agent's poll and journaled as `note`
--
-- Returns {status, state, flags}
--   'ok'         rejected now
--   'conflict'   resolved before (state names the outcome, flags who resolved it)
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: pending falls by exactly the hold's amounts.

local id, err = hold_id_arg()
if not id then return err end
local retention_ms
retention_ms, err = retention_arg()
if not retention_ms then return err end
local by = ARGV[3]
if not valid_id(by) or #ARGV < 3 or #ARGV > 4 then
  return {'bad_input', 'approver', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
local note = ARGV[4] or ''
if #note > MAX_NOTE then return {'bad_input', 'note', 'must be at most 2048 bytes'} end
local hold = load_hold(id)
if not hold then return {'not_found', '', ''} end
if hold.st ~= 'escalated' then return {'conflict', hold.st, hold.by or ''} end

local release = negate(hold.amounts)
local n = #hold.accounts
add_balances(hold.accounts, release, zeros(n))
set_state(id, 'escalated', 'rejected', retention_ms, {'by', by, 'note', note}, hold.cr)
journal({'op', 'reject', 'hold', id, 'st', 'rejected', 'by', by, 'note', note,
         'd', deltas(hold.accounts, release, zeros(n))})
return {'ok', 'rejected', by}
