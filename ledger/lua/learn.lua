-- learn: count one compensation outcome of a posted hold's route for learned
-- prices, at most once per hold: however often an effect's settlement is reported,
-- its route's prices move by one observation. The mark is kept on the hold, in the
-- same script as the count, so no crash or repeat can count it twice.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua),
--          then KEYS[8] `...:observed:<outcome>` (the outcome of ARGV[3])
-- ARGV[1]  hold id
-- ARGV[2]  route id (the field of the outcome counts)
-- ARGV[3]  outcome: 'failures' (nothing recovered) or 'successes'
--
-- Returns {status, state, flags}
--   'ok'         counted now
--   'exists'     this hold's outcome was counted already (flags: which); nothing written
--   'conflict'   the hold is not posted
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: `observed:<outcome>` of a route rises by at most one per hold.

local id, err = hold_id_arg()
if not id then return err end
local route, outcome = ARGV[2], ARGV[3]
if #ARGV ~= 3 or type(route) ~= 'string' or #route < 1 or #route > 1024 then
  return {'bad_input', 'route', 'must be 1-1024 bytes'}
end
if outcome ~= 'failures' and outcome ~= 'successes' then
  return {'bad_input', 'outcome', "must be 'failures' or 'successes'"}
end
local observed = P .. 'observed:' .. outcome
if KEYS[8] ~= observed then
  return {'bad_input', 'keys', 'KEYS[8] must be ' .. observed}
end
local held = redis.call('HMGET', hkey(id), 'st', 'lrn')
if not held[1] then return {'not_found', '', ''} end
if held[1] ~= 'posted' then return {'conflict', held[1], ''} end
if held[2] then return {'exists', 'posted', held[2]} end
redis.call('HSET', hkey(id), 'lrn', outcome)
redis.call('HINCRBY', observed, route, 1)
return {'ok', 'posted', outcome}
