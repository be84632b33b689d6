-- policy_put: write a tenant's policy into the fleet's policy store, only over the
-- version the writer read (compare-and-set), so a host that read an older version
-- never overwrites a newer one (ledger/policystore.py).
--
-- KEYS[1]  the tenant's policy hash: v (version, 1, 2, ...), digest, text,
--          stamp_ms (when its content was written: the file's change time, or
--          Redis time for a write without one), origin (who wrote it)
-- ARGV[1]  the version the writer read (0: the store had none)
-- ARGV[2]  digest of the text (names the version on /metrics and in logs)
-- ARGV[3]  the policy text (YAML)
-- ARGV[4]  stamp_ms ('': Redis time now)
-- ARGV[5]  origin (e.g. file:<host>:<path>, upload:<admin>)
--
-- Returns {won, version, stamp_ms}: won 1 with the version now stored (the same
-- version if the store already held this digest), or won 0 with the store's
-- version, which the writer must read again before deciding anew.
--
-- Invariant: the version only grows, and every version's text is written once.

redis.replicate_commands() -- Redis 6 needs it to write after TIME; a no-op on 7
local expected = tonumber(ARGV[1])
if #ARGV ~= 5 or not expected or ARGV[2] == '' then
  return redis.error_reply('policy_put takes version, digest, text, stamp_ms, origin')
end
local current = redis.call('HMGET', KEYS[1], 'v', 'digest', 'stamp_ms')
local version = tonumber(current[1] or '0')
if version ~= expected then return {0, version, current[3] or '0'} end
if current[2] == ARGV[2] then return {1, version, current[3]} end
local stamp = ARGV[4]
if stamp == '' then
  local now = redis.call('TIME')
  stamp = tostring(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
end
redis.call('HSET', KEYS[1], 'v', version + 1, 'digest', ARGV[2], 'text', ARGV[3],
  'stamp_ms', stamp, 'origin', ARGV[5])
return {1, version + 1, stamp}
