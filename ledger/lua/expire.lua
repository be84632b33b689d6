-- expire: settle one hold whose deadline has passed, by the sweeper's rule
-- (expire_one; for an operator who does not want to wait for the sweeper).
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  retention_ms for the settled record (0 keeps it)
--
-- Returns {status, state, flags}
--   'ok'         state `expired` (an escalation nobody resolved, or a pending hold
--                never armed: provably never fired, budget released) or
--                `ambiguous` (armed: it may have fired, so it stays charged)
--   'not_due'    the deadline has not passed; nothing written
--   'conflict'   the hold is not pending or escalated (ambiguous holds never expire)
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: nothing is released on a guess: only a hold that provably never fired
-- gives its budget back.

local id, err = hold_id_arg()
if not id then return err end
local retention_ms
retention_ms, err = retention_arg()
if not retention_ms then return err end
if #ARGV ~= 2 then return {'bad_input', 'arguments', 'expire takes a hold id and a retention'} end
local hold = load_hold(id)
if not hold then return {'not_found', '', ''} end
if hold.st ~= 'pending' and hold.st ~= 'escalated' then return {'conflict', hold.st, ''} end
local now = now_ms()
if hold.deadline > now then return {'not_due', hold.st, ''} end

expire_one(id, retention_ms)
return {'ok', redis.call('HGET', hkey(id), 'st'), ''}
