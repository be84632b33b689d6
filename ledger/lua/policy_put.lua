-- policy_put: write a tenant's policy into the fleet's policy store over the version
-- the writer read (compare-and-set), record it in the tenant's policy history, and
-- remember what the writing source (a host's policy file) read, which is the base
-- its next edit is measured from (ledger/policystore.py, gateway/tenants.py).
--
-- KEYS[1]  the tenant's policy hash: v (version, 1, 2, ...), digest, text,
--          stamp_ms (Redis time of the write), origin (who wrote it)
-- KEYS[2]  the tenant's policy history: a list of JSON entries {v, digest,
--          stamp_ms, origin, text}, newest first, ARGV[8] kept
-- KEYS[3]  the tenant's policy sources: a hash, source id -> the text that source
--          last read (a host's file as it was when the host acted on it)
-- KEYS[4]  the tenant's accounts (account.lua): read only when KEYS[1] holds no
--          version, for the highest `<account>|pv` (the version limits came from)
-- ARGV[1]  the version the writer read (0: the store had none)
-- ARGV[2]  the digest of the text the writer read ('' with version 0)
-- ARGV[3]  digest of the text to store
-- ARGV[4]  the policy text (YAML) to store
-- ARGV[5]  origin (e.g. file <host>:<path>, upload <admin>)
-- ARGV[6]  source id ('': a write that is no source's, e.g. an upload)
-- ARGV[7]  the source's text, its base from now on (ignored without ARGV[6])
-- ARGV[8]  how many history entries to keep (>= 1)
--
-- Returns {won, version, stamp_ms, digest}: won 1 with the version now stored (the
-- same version if the store already held this digest: nothing but the source is
-- written), or won 0 with the store's version and its digest, which the writer must
-- read again before deciding anew (and nothing is written).
--
-- Invariant: the version only grows, also when the store lost its keys while the
-- accounts kept theirs (a flush of the store, a fresh store on old accounts): it
-- starts again above every version an account's limits came from, or account.lua
-- would keep each new version's limits out; each version is stamped by Redis's clock,
-- never a host's; a source's base changes only together with a write it decided
-- on the version it read. A version is its number and its digest together: a
-- failover that lost version 7 lets the new primary write another version 7, and a
-- writer that read the lost one must not write over it as if it had read it.

redis.replicate_commands() -- Redis 6 needs it to write after TIME; a no-op on 7
local expected, keep = tonumber(ARGV[1]), tonumber(ARGV[8])
if #ARGV ~= 8 or not expected or ARGV[3] == '' or not keep or keep < 1 then
  return redis.error_reply('policy_put takes version, digest read, digest, text, origin, '
    .. 'source, source text, keep')
end
local current = redis.call('HMGET', KEYS[1], 'v', 'digest', 'stamp_ms')
local version, digest = tonumber(current[1] or '0'), current[2] or ''
if version ~= expected or digest ~= ARGV[2] then
  return {0, version, current[3] or '0', digest}
end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[3], ARGV[6], ARGV[7]) end
if digest == ARGV[3] then return {1, version, current[3], digest} end
-- No version stored: a new tenant (no accounts yet: nothing to read) or a store that
-- lost the tenant's keys; once per such start, however many accounts there are.
if version == 0 then
  local fields = redis.call('HGETALL', KEYS[4])
  for i = 1, #fields, 2 do
    if string.sub(fields[i], -3) == '|pv' then
      version = math.max(version, tonumber(fields[i + 1]) or 0)
    end
  end
end
local now = redis.call('TIME')
local stamp = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], 'v', version + 1, 'digest', ARGV[3], 'text', ARGV[4],
  'stamp_ms', stamp, 'origin', ARGV[5])
redis.call('LPUSH', KEYS[2], cjson.encode({
  v = version + 1, digest = ARGV[3], stamp_ms = stamp, origin = ARGV[5], text = ARGV[4]}))
redis.call('LTRIM', KEYS[2], 0, keep - 1)
return {1, version + 1, tostring(stamp), ARGV[3]}
