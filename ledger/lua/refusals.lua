-- refusals: add one gateway process's refusal counts to one minute of a tenant's
-- tally (ledger/refusals.py), which every process of the fleet adds to.
--
-- KEYS[1]  `irrev:{<tenant>}:refusals:<minute>`: a hash, field
--          `<reason>|<transport>|<agent>|<route>` -> how many
-- ARGV[1]  ttl_ms (> 0): the key lives that long after its last write
-- ARGV[2]  max_fields (> 0): how many fields the hash may have before a new one is
--          counted under its fallback instead
-- ARGV[3..] triples: field, its fallback field, count (a positive integer). A new
--          field met when the hash has max_fields fields is counted under its
--          fallback (`<reason>|<transport>|*|*`: other agents and routes), which
--          is always taken: reasons and transports are the gateway's own codes, so
--          the fallbacks are few.
--
-- Returns {fields now in the hash, Redis TIME seconds, microseconds}: the clock the
-- caller buckets its next counts by (read after the writes, so verbatim replication
-- of the script would replicate the same writes).
--
-- Invariant: the hash has at most max_fields fields plus fallbacks, whatever the
-- number of processes adding to it; every input is checked before the first write.

local ttl_ms, max_fields = tonumber(ARGV[1]), tonumber(ARGV[2])
if not ttl_ms or ttl_ms <= 0 or ttl_ms % 1 ~= 0 or not max_fields or max_fields <= 0
    or max_fields % 1 ~= 0 or #ARGV < 5 or (#ARGV - 2) % 3 ~= 0 then
  return redis.error_reply('refusals takes ttl_ms, max_fields and (field, fallback, count) triples')
end
for i = 3, #ARGV, 3 do
  local n = tonumber(ARGV[i + 2])
  if ARGV[i] == '' or ARGV[i + 1] == '' or not n or n <= 0 or n % 1 ~= 0 then
    return redis.error_reply('refusals: each count is a positive integer of a named field')
  end
end
local key = KEYS[1]
local size = redis.call('HLEN', key)
for i = 3, #ARGV, 3 do
  local field = ARGV[i]
  if size >= max_fields and redis.call('HEXISTS', key, field) == 0 then
    field = ARGV[i + 1]
  end
  if redis.call('HINCRBY', key, field, ARGV[i + 2]) == tonumber(ARGV[i + 2]) then
    size = size + 1
  end
end
redis.call('PEXPIRE', key, ttl_ms)
local now = redis.call('TIME')
return {size, now[1], now[2]}
