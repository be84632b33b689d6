-- epoch: bump one of the fleet's epochs (policy, keys, outcomes: ledger/keys.py) to
-- a value it never held before, even across a failover. Hosts reload when an epoch
-- differs from the one they read last; a plain INCR after a failover that lost the
-- last bump gives the lost value again, for other contents, and a host that read
-- the lost value would never reload (it would keep serving a revoked key).
--
-- KEYS[1]  the epoch (a string: an integer; absent: 0)
-- ARGV     none
--
-- Returns the new epoch: the larger of the old one + 1 and Redis's TIME in
-- microseconds.
--
-- Invariant: an epoch only grows; a bump on a primary that lost writes of another
-- (a failover) gives a value none of them gave, unless both were made within the
-- same microsecond by Redis's clock (so the value is below 2^53: exact in Lua).

if #ARGV ~= 0 then
  return redis.error_reply('epoch takes no arguments')
end
local old = tonumber(redis.call('GET', KEYS[1])) or 0
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local new = math.max(old + 1, now_us)
local text = string.format('%.0f', new)
redis.call('SET', KEYS[1], text)
return text
