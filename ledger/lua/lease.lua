-- lease: take or keep a lease, one holder at a time (ledger/lease.py).
--
-- KEYS[1]  the lease key (a string: the holder's token)
-- ARGV[1]  the caller's token (unique per holder and process)
-- ARGV[2]  ttl_ms: how long the lease lasts from now, unless renewed (> 0)
--
-- Returns 1 if the caller holds the lease for ttl_ms from now (taken while free,
-- or renewed because it already held it), 0 if another holder has it.
--
-- Invariant: a holder only ever extends its own lease; a lease that lapsed is free
-- for whoever asks first, its former holder included.

local token = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
if #ARGV ~= 2 or token == '' or not ttl_ms or ttl_ms <= 0 or ttl_ms % 1 ~= 0 then
  return redis.error_reply('lease takes a token and a positive integer ttl_ms')
end
local holder = redis.call('GET', KEYS[1])
if holder == token then
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
  return 1
end
if holder then return 0 end
redis.call('SET', KEYS[1], token, 'PX', ttl_ms)
return 1
