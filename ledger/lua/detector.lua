-- detector: one request of a route against the tenant's stress detector for it,
-- Page's CUSUM for a Poisson rate (pricing/stress.py), whose state every gateway of
-- the tenant shares: one detector per route, not one per process.
--
-- KEYS     accounts, journal (_lib.lua), then KEYS[3] `...:stress`: a hash of every
--          detector of the tenant, fields `<tag>|<name>` (score s, last tick l, last
--          alarm a, calm requests r, calm ticks t, run n, on, the tick length ms and
--          the settings' digest cfg); in the tenant's slot, so it moves with the rest
--          of the tenant's keys in a reshard; KEYS[4] `...:stress-alarms:<tag>`,
--          the route's runs that ended in an alarm (a sorted set, member and score the
--          run), the newest MAX_ALARMS of them; `<tag>|cut` in the hash is the newest
--          run trimmed from it, so that a run at or below it reads as alarmed;
--          KEYS[5] the record of the request's hold (`...:hold:<ARGV[10]>`) and
--          KEYS[6] the tenant's settled index, which say whether it is a repeat
-- ARGV[1]  the route's tag (ledger/records.py's pool_tag: 16 hex digits)
-- ARGV[2]  tick_ms: the detector's tick (1 .. 86,400,000)
-- ARGV[3]  shift (> 1), ARGV[4] h (> 0), ARGV[5] hold in ticks (an integer >= 0)
-- ARGV[6]  warm-up: calm requests over ARGV[7] calm ticks (>= 1), the history a new
--          detector starts from
-- ARGV[8]  ttl_ms: the hash lives that long after its last request (> 0)
-- ARGV[9]  the route's id, for the journal (1 to 1024 bytes)
-- ARGV[10] the request's hold id: a repeat of a request whose hold is kept (or
--          archived, its id still taken) is not counted again
--
-- Returns {'ok', on, run, tick, score, calm, alarm, ended, ended_at, tripped, cleared,
--          counted}
--   on 1 if this request is priced stressed; run the run it belongs to; tick the
--   detector's tick now (Redis TIME / tick_ms); score and calm (requests per tick)
--   after it, as '%.17g' text; alarm 1 if its arrival alarmed; ended 1 if the run
--   before it decayed to 0 first, vouched for from tick ended_at; tripped 1 if the
--   detector turned on here, cleared 1 if it had turned off since the last request
--   (both journaled, op `stress`); counted 1 if the request was counted, 0 for a
--   repeat: then nothing is written and the rest is the detector stood at now, as
--   pricing.stress.cusum_at reads it (alarm, tripped and cleared 0: a clearing is
--   journaled by the next counted request)
--   {'bad_input', field, message}   nothing written
--
-- Invariant: the state after a counted request is pricing.stress.cusum_step's on the
-- state before it (tests/ledger/test_detector.py holds the two to one recorded
-- stream), and a repeat changes nothing (a model repeating a call, an agent retrying
-- after a timeout: one effect, one count); a detector whose tick length or settings
-- changed starts again from its warm-up, so that a state is never read in units it
-- was not written in, but its runs go on numbering from where they were: a run's
-- number names one run for ever, and a run that alarmed is in KEYS[4] (or at or below
-- `cut`), so that a margin kept for a run (gateway/state/margins.py) is released only
-- for a run that ended calm. Ticks come from Redis's clock, never a gateway's, so
-- hosts with skewed clocks step one detector alike.

local MIN_DECAY = 1e-12
local NEVER = -1e9
local MAX_ALARMS = 10000

local function num(s, lo, hi, whole)
  local n = tonumber(s)
  if not n or n ~= n or n < lo or n > hi or (whole and n % 1 ~= 0) then
    return nil
  end
  return n
end

local function text(x)
  return string.format('%.17g', x)
end

local tag = ARGV[1]
if #ARGV ~= 10 or #ARGV[9] < 1 or #ARGV[9] > 1024 or not tag or not string.match(tag, '^%x+$') or #tag > 32 then
  return {'bad_input', 'route', 'the route tag must be 1-32 hex digits, then 7 settings, the route id and the hold id'}
end
local id = ARGV[10]
if not valid_id(id) then
  return {'bad_input', 'hold_id', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
if #KEYS ~= 6 or KEYS[3] ~= P .. 'stress' or KEYS[4] ~= P .. 'stress-alarms:' .. tag
    or KEYS[5] ~= hkey(id) or KEYS[6] ~= P .. 'settled' then
  return {'bad_input', 'keys', 'KEYS[3..6] must be the tenant\'s stress hash, the route\'s alarms, the hold\'s record and the settled index'}
end
local tick_ms = num(ARGV[2], 1, 86400000, true)
local shift = num(ARGV[3], 1, 1e6)
local h = num(ARGV[4], 0, 1e9)
local hold = num(ARGV[5], 0, 1e9, true)
local prior_requests = num(ARGV[6], 0, 1e15)
local prior_ticks = num(ARGV[7], 1, 1e15)
local ttl_ms = num(ARGV[8], 1, MAX_AMOUNT, true)
if not tick_ms or not shift or shift <= 1 or not h or h <= 0 or not hold
    or not prior_requests or not prior_ticks or not ttl_ms then
  return {'bad_input', 'settings', 'tick_ms, shift > 1, h > 0, hold, the warm-up and ttl_ms must be in range'}
end

local STRESS, ALARMS = KEYS[3], KEYS[4]
local names = {'s', 'l', 'a', 'r', 't', 'n', 'on', 'ms', 'cfg', 'cut'}
local fields = {}
for i, name in ipairs(names) do
  fields[i] = tag .. '|' .. name
end
local stored = redis.call('HMGET', STRESS, unpack(fields))
local t = math.floor(now_ms() / tick_ms)
local cfg = table.concat({ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]}, ',')
local s
local kept = stored[8] == tostring(tick_ms) and stored[9] == cfg and tonumber(stored[1])
if kept then
  s = {score = tonumber(stored[1]), last = tonumber(stored[2]), alarm = tonumber(stored[3]),
    requests = tonumber(stored[4]), ticks = tonumber(stored[5]), run = tonumber(stored[6])}
else
  -- pricing.stress.CusumState.warmed(prior_requests, prior_ticks, t), its runs
  -- numbered on from the last detector's
  s = {score = 0, last = t, alarm = NEVER, requests = prior_requests,
    ticks = prior_ticks, run = stored[6] and (tonumber(stored[6]) or 0) + 1 or 0}
end
local was_on = stored[7] == '1'
if t < s.last then
  -- Redis's clock stepped back (a failover to a replica behind it): the request is
  -- taken as made at the last tick, so that no tick is counted twice.
  t = s.last
end

-- pricing.stress.cusum_step, line by line
local off = t - s.alarm > hold
local ticks_off = s.ticks + (off and (t - s.last) or 0)
local calm = s.requests / math.max(ticks_off, 1)
local decay = math.max((shift - 1) * calm, MIN_DECAY)
local decayed = s.score - decay * (t - s.last)
local ended = s.score > 0 and decayed <= 0
local ended_at = s.last + math.ceil(s.score / decay)
local run = s.run + (ended and 1 or 0)
if redis.call('EXISTS', KEYS[5]) == 1 or archived_id(KEYS[6], id) then
  return {'ok', t - s.alarm <= hold and 1 or 0, text(run), text(t), text(math.max(decayed, 0)),
    text(calm), 0, ended and 1 or 0, text(ended_at), 0, 0, 0}
end
local last_alarm = s.alarm
local score = math.max(decayed, 0)
local alarm = score >= h
if alarm then
  redis.call('ZADD', ALARMS, text(run), text(run))
  if redis.call('ZCARD', ALARMS) > MAX_ALARMS then
    local oldest = redis.call('ZRANGE', ALARMS, 0, 0)[1]
    redis.call('ZREMRANGEBYRANK', ALARMS, 0, 0)
    redis.call('HSET', STRESS, fields[10], oldest)
  end
  run = run + 1
  s.alarm = t
  score = 0
end
local on = t - s.alarm <= hold
score = score + math.log(shift)
local requests = s.requests + (on and 0 or 1)

-- `on` as the last request left it may have run out since (`off`): it cleared then
local cleared = was_on and off
local tripped = alarm and not (was_on and not off)
if cleared then
  -- by its hold running out, or now, when new settings started it again
  local at = kept and last_alarm + hold + 1 or t
  journal({'op', 'stress', 'route', ARGV[9], 'st', 'off', 'tick', text(at)})
end
if tripped then
  journal({'op', 'stress', 'route', ARGV[9], 'st', 'on', 'tick', text(t), 'calm', text(calm)})
end
redis.call('HSET', STRESS, fields[1], text(score), fields[2], text(t), fields[3], text(s.alarm),
  fields[4], text(requests), fields[5], text(ticks_off), fields[6], text(run),
  fields[7], on and '1' or '0', fields[8], tostring(tick_ms), fields[9], cfg)
redis.call('PEXPIRE', STRESS, ttl_ms)
redis.call('PEXPIRE', ALARMS, ttl_ms)
return {'ok', on and 1 or 0, text(run), text(t), text(score), text(calm), alarm and 1 or 0,
  ended and 1 or 0, text(ended_at), tripped and 1 or 0, cleared and 1 or 0, 1}
