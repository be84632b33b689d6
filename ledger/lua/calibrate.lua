-- calibrate: record a settled hold's realised residual factor for its route's
-- self-calibrating price (pricing/calibration.py), at most once per hold: however
-- often an effect's realised loss is reported, its route's evidence grows by one
-- factor. The mark is kept on the hold, in the same script as the sums, so no crash
-- or repeat can count it twice.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua),
--          then KEYS[8] `...:observed:factors`, one hash of every route's evidence:
--          fields `n|<route>` (count), `s|<route>` (sum of factors in ppm),
--          `q|<route>` (sum of squared ppm), `t|<route>` (the largest ppm factors,
--          descending, comma-separated)
-- ARGV[1]  hold id
-- ARGV[2]  route id
-- ARGV[3]  the realised residual factor in parts per million, 0..1000000
-- ARGV[4]  how many of the largest factors to keep, 1..64
--
-- Returns {status, state, flags}
--   'ok'         recorded now
--   'exists'     this hold's factor was recorded already; nothing written
--   'conflict'   the hold is not posted
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: `n|<route>` rises by at most one per hold, and `s`, `q`, `t` with it.

local id, err = hold_id_arg()
if not id then return err end
local route = ARGV[2]
if #ARGV ~= 4 or type(route) ~= 'string' or #route < 1 or #route > 1024 then
  return {'bad_input', 'route', 'must be 1-1024 bytes'}
end
local ppm = uint(ARGV[3], 1000000)
if not ppm then
  return {'bad_input', 'factor', 'must be an integer number of ppm in 0..1000000'}
end
local keep = uint(ARGV[4], 64)
if not keep or keep < 1 then
  return {'bad_input', 'keep', 'must be 1..64'}
end
local factors = P .. 'observed:factors'
if KEYS[8] ~= factors then
  return {'bad_input', 'keys', 'KEYS[8] must be ' .. factors}
end
local held = redis.call('HMGET', hkey(id), 'st', 'lrf')
if not held[1] then return {'not_found', '', ''} end
if held[1] ~= 'posted' then return {'conflict', held[1], ''} end
if held[2] then return {'exists', 'posted', ''} end
redis.call('HSET', hkey(id), 'lrf', fmt(ppm))
redis.call('HINCRBY', factors, 'n|' .. route, 1)
redis.call('HINCRBY', factors, 's|' .. route, fmt(ppm))
redis.call('HINCRBY', factors, 'q|' .. route, fmt(ppm * ppm))
local top = split_numbers(redis.call('HGET', factors, 't|' .. route))
top[#top + 1] = ppm
table.sort(top, function(a, b) return a > b end)
while #top > keep do
  table.remove(top)
end
redis.call('HSET', factors, 't|' .. route, join_numbers(top))
return {'ok', 'posted', ''}
