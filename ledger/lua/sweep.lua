-- sweep: expire due holds of one tenant, the ones the caller names (the first few
-- of the deadline index, which it read just before): a script touches only
-- declared keys, so the caller declares the holds.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated (_lib.lua), then
--          KEYS[5+i] the key of hold ARGV[2+i], for i = 1..n (n <= 1000)
-- ARGV[1]  retention_ms for the settled records (0 keeps them)
-- ARGV[2]  n, then n hold ids
--
-- Returns {status, visited, remaining_due}
--   'ok'         visited: named holds that were due and were expired or made
--                ambiguous by expire_one's rule (the others are left alone);
--                remaining_due: holds still due after that
--   'bad_input'  (visited = field, remaining_due = message)
--
-- Invariant: the rule of expire_one: nothing is released on a guess; a hold that
-- is not due, or no longer pending or escalated, is untouched.

local retention_ms = uint(ARGV[1], MAX_AMOUNT)
if not retention_ms then return {'bad_input', 'retention_ms', 'must be an integer >= 0'} end
local n = uint(ARGV[2], 1000)
if not n or #ARGV ~= 2 + n or #KEYS ~= 5 + n then
  return {'bad_input', 'holds', 'must name 0 to 1000 holds, each with its key'}
end
for i = 1, n do
  local id = ARGV[2 + i]
  if not valid_id(id) or KEYS[5 + i] ~= hkey(id) then
    return {'bad_input', 'holds', 'KEYS[5+i] must be the key of hold ARGV[2+i]'}
  end
end
local now = now_ms()
local visited = 0
for i = 1, n do
  local id = ARGV[2 + i]
  local deadline = redis.call('ZSCORE', DEADLINES, id)
  if deadline and tonumber(deadline) <= now then
    expire_one(id, retention_ms)
    visited = visited + 1
  end
end
return {'ok', visited, redis.call('ZCOUNT', DEADLINES, '-inf', now)}
