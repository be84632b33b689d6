-- approve: a human lets an escalated effect go ahead. Consume-once: of any number
-- of concurrent approvals and rejections exactly one finds the hold escalated.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  retention_ms for the record should the escalation turn out expired
--          (it is expired then and there, as the sweeper would)
-- ARGV[3]  ttl_ms of the now pending hold (the approver forwards the effect)
-- ARGV[4]  approver id (an admin's name, or `rule:<id>` for an automatic approval)
-- ARGV[5]  optional note: why, in the approver's words (at most 2048 bytes), kept
--          with the hold for the agent's poll and journaled as `note`
--
-- Returns {status, state, flags} and, when 'ok', {..., deadline_ms, request}
--   'ok'         approved: pending, armed, with a new deadline: flags is the
--                approver, deadline_ms the new deadline (Redis's clock, ms) and
--                request the bytes kept with the hold at reserve ('' if none), so
--                the approver forwards the effect without another read or clock
--   'conflict'   someone resolved it first or it expired: state is the outcome
--                (pending/posted/voided/ambiguous after an approval, rejected,
--                expired), flags is who resolved it
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: the budget was held at escalation, so approval changes no balance and
-- can never overdraw. A calibrating route's approved hold joins its open set (one
-- that would take the set past its bounds is left out, uncounted: _lib.lua), at the
-- price it was escalated at: its price alone (reserve.lua sends a reserve priced for
-- a pool that would escalate back to be priced alone), which every set covers (the
-- condition reserve.lua checks, _lib.lua's kish >= the count priced for, holds for
-- a count of 1 whatever the set), so no check of the set is needed here.

local id, err = hold_id_arg()
if not id then return err end
local retention_ms
retention_ms, err = retention_arg()
if not retention_ms then return err end
local ttl_ms = uint(ARGV[3], MAX_AMOUNT)
if not ttl_ms then return {'bad_input', 'ttl_ms', 'must be an integer >= 0'} end
local by = ARGV[4]
if not valid_id(by) or #ARGV < 4 or #ARGV > 5 then
  return {'bad_input', 'approver', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
local note = ARGV[5] or ''
if #note > MAX_NOTE then return {'bad_input', 'note', 'must be at most 2048 bytes'} end
local hold = load_hold(id, true)
if not hold then return {'not_found', '', ''} end
if hold.st ~= 'escalated' then return {'conflict', hold.st, hold.by or ''} end

local now = now_ms()
if hold.deadline <= now then
  expire_one(id, retention_ms)
  return {'conflict', 'expired', ''}
end
local deadline = now + ttl_ms
-- A calibrating route's hold joins its open set now (_lib.lua's OPEN): escalated,
-- it was never sent and did not count; priced alone, it needs no set to join.
set_state(id, 'escalated', 'pending', 0, {'arm', '1', 'dl', fmt(deadline), 'by', by, 'note', note},
  hold.cr)
redis.call('ZADD', DEADLINES, fmt(deadline), id)
journal({'op', 'approve', 'hold', id, 'st', 'pending', 'by', by, 'note', note})
-- A hold reserved by an older irrev (sharing the Redis during an upgrade) kept its
-- request in its record (read with it: set_state does not change it).
local request = redis.call('GET', pkey(id)) or hold.req or ''
return {'ok', 'pending', by, deadline, request}
