-- rate: one read request against the read rates of the accounts it is made for (an
-- agent's, its principal's: account.lua's `|rtr`). A read holds nothing and has no
-- reserve, so this is its one Redis call, made only where a rate is set.
--
-- KEYS     accounts (_lib.lua)
-- ARGV[1]  n (1..8), then n account ids
--
-- Returns {'ok'}                            in time for every rate: each one moved on
--         {'rate_limited', account, wait_ms}  too early for that account's rate:
--                                           nothing written; ask again in wait_ms
--         {'bad_input', field, message}     nothing written
--
-- Invariant: the rates of _lib.lua's rate_step, by Redis's clock; a refused request
-- moves no rate.

local n = uint(ARGV[1], MAX_ACCOUNTS)
if not n or n < 1 or #ARGV ~= 1 + n then
  return {'bad_input', 'accounts', 'must name 1 to ' .. MAX_ACCOUNTS .. ' accounts'}
end
local names = {}
for i = 1, n do
  if not valid_id(ARGV[1 + i]) then
    return {'bad_input', 'accounts', 'account ids must be well formed'}
  end
  names[i] = field(ARGV[1 + i], 'rtr')
end
local now = now_ms()
local texts = redis.call('HMGET', ACCOUNTS, unpack(names))
local paced = {}
for i = 1, n do
  local next_rate, wait_ms = rate_step(texts[i], now)
  if wait_ms > 0 then
    return {'rate_limited', ARGV[1 + i], fmt(wait_ms)}
  end
  if next_rate then
    paced[#paced + 1], paced[#paced + 2] = names[i], next_rate
  end
end
if #paced > 0 then
  redis.call('HSET', ACCOUNTS, unpack(paced))
end
return {'ok'}
