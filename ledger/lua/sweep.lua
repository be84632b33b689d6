-- sweep: expire due holds of one tenant. A script touches only declared keys, so
-- it expires the holds the caller names (KEYS and ARGV), and answers which holds
-- are due now for the caller's next call: called first with none, then with those.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated (_lib.lua), then
--          KEYS[4+2i] and KEYS[5+2i] the keys of hold ARGV[3+i] (record, request),
--          for i = 1..n
-- ARGV[1]  retention_ms for the settled records (0 keeps them)
-- ARGV[2]  batch: report at most this many due holds (1..1000)
-- ARGV[3]  n (0..1000), then n hold ids
--
-- Returns {status, visited, remaining_due, due_1, ..., due_k}
--   'ok'         visited: named holds that were due and were expired or made
--                ambiguous by expire_one's rule (the others are left alone);
--                remaining_due: how many holds are due after that; due_1..due_k
--                the first of them (k <= batch), by deadline
--   'bad_input'  (visited = field, remaining_due = message)
--
-- Invariant: the rule of expire_one: nothing is released on a guess; a hold that
-- is not due, or no longer pending or escalated, is untouched.

local retention_ms = uint(ARGV[1], MAX_AMOUNT)
if not retention_ms then return {'bad_input', 'retention_ms', 'must be an integer >= 0'} end
local batch = uint(ARGV[2], 1000)
if not batch or batch < 1 then return {'bad_input', 'batch', 'must be an integer in [1, 1000]'} end
local n = uint(ARGV[3], 1000)
if not n or #ARGV ~= 3 + n or #KEYS ~= 5 + 2 * n then
  return {'bad_input', 'holds', 'must name 0 to 1000 holds, each with its two keys'}
end
for i = 1, n do
  local id = ARGV[3 + i]
  if not valid_id(id) or KEYS[4 + 2 * i] ~= hkey(id) or KEYS[5 + 2 * i] ~= pkey(id) then
    return {'bad_input', 'holds', 'KEYS[4+2i] and KEYS[5+2i] must be the keys of hold ARGV[3+i]'}
  end
end
local now = now_ms()
local visited = 0
for i = 1, n do
  local id = ARGV[3 + i]
  local deadline = redis.call('ZSCORE', DEADLINES, id)
  if deadline and tonumber(deadline) <= now then
    expire_one(id, retention_ms)
    visited = visited + 1
  end
end
local reply = {'ok', visited, redis.call('ZCOUNT', DEADLINES, '-inf', now)}
if reply[3] > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', now, 'LIMIT', 0, batch)) do
    reply[#reply + 1] = id
  end
end
return reply
