-- watch: take or keep the fleet's watch, and while it is ours say so on the change
-- feed. One process of the fleet holds the watch and does the fleet-wide checks that
-- every process otherwise did for itself (gateway/fleetwatch.py); its beats also
-- keep every subscriber's connection proven alive without a PING of its own
-- (ledger/changes.py).
--
-- KEYS[1]  the watch lease `irrev:{fleet}:lease:watch` (a string: its holder's token)
-- ARGV[1]  the caller's token (unique per holder and process)
-- ARGV[2]  ttl_ms: how long the watch lasts from now, unless renewed (> 0)
-- ARGV[3]  the change feed's channel, on which 'beat' is published
--
-- Returns 1 if the caller holds the watch for ttl_ms from now (taken while free, or
-- renewed because it already held it) and a beat was published; 0 if another
-- holder has it (nothing published).
--
-- Invariant: only the watch's holder beats, so a beat heard was sent by a process
-- that held the watch then; a holder only ever extends its own watch.

local token = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
if #ARGV ~= 3 or token == '' or not ttl_ms or ttl_ms <= 0 or ttl_ms % 1 ~= 0 then
  return redis.error_reply('watch takes a token, a positive integer ttl_ms and a channel')
end
local holder = redis.call('GET', KEYS[1])
if holder == token then
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
elseif holder then
  return 0
else
  redis.call('SET', KEYS[1], token, 'PX', ttl_ms)
end
redis.call('PUBLISH', ARGV[3], 'beat')
return 1
