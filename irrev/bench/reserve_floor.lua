-- reserve_floor: the Redis commands ledger/lua/reserve.lua runs to admit a hold on
-- accounts that exist, in its order, on the same keys and with as many arguments
-- (the record's limits and used amounts are its amounts here: shorter), but none of
-- its checks, decision, arithmetic or reply: what no reserve that keeps the same
-- records can go below (`irrev bench ledger` times it beside reserve and the trivial
-- script). Only for a tenant of the bench's own: it writes made-up balances.
--
-- KEYS     reserve.lua's: accounts, journal, deadlines, ambiguous, escalated, hold,
--          payload, settled
-- ARGV     reserve.lua's (the bench's reserves: no account to open, no pool), of
--          which it reads the hold id (1), fingerprint (2), armed (5), request (8),
--          provenance (9), n (10) and the n pairs of account id and amount
--
-- Returns {'ok'}.
--
-- Invariant: none of the ledger's; tests/ledger/test_bench_floor.py checks that it
-- issues the same commands, on the same keys, with the same number of arguments
-- each, as a reserve that admits.

-- Redis 6.2 writes after TIME only under effects replication (7 always replicates so).
redis.replicate_commands()
local id, request, provenance, n = ARGV[1], ARGV[8], ARGV[9], tonumber(ARGV[10])
local names, pends, accounts, amounts = {}, {}, {}, {}
for i = 1, n do
  local account, amount, at = ARGV[9 + 2 * i], ARGV[10 + 2 * i], 9 * (i - 1)
  accounts[i], amounts[i] = account, amount
  names[at + 1], names[at + 2] = account .. '|limit', account .. '|soft'
  names[at + 3], names[at + 4] = account .. '|win', account .. '|appr'
  names[at + 5], names[at + 6] = account .. '|pend', account .. '|post'
  names[at + 7], names[at + 8] = account .. '|ws', account .. '|raise'
  names[at + 9] = account .. '|rte'
  pends[2 * i - 1], pends[2 * i] = names[at + 5], amount
end
redis.call('HGET', KEYS[6], 'fp')
redis.call('HGET', KEYS[8], id)
redis.call('HMGET', KEYS[1], unpack(names))
local now = redis.call('TIME')[1] .. '000'
-- The bench's reserves are a batch's items (Ledger.reserve_many), which look for due
-- holds before deciding; an admitted single reserve does without.
redis.call('ZRANGE', KEYS[3], '0', '0', 'WITHSCORES')
local acc, amt = table.concat(accounts, ','), table.concat(amounts, ',')
redis.call('HSET', KEYS[6], 'st', 'pending', 'fp', ARGV[2], 'arm', ARGV[5], 't0', now,
  'dl', now, 'acc', acc, 'amt', amt, 'why', 'within_budget', 'lim', amt, 'used', amt)
if #request > 0 then
  redis.call('SET', KEYS[7], request)
else
  redis.call('DEL', KEYS[7])
end
redis.call('HSET', KEYS[1], unpack(pends))
redis.call('ZADD', KEYS[3], now, id)
if #provenance > 0 then
  redis.call('XADD', KEYS[2], '*', 'op', 'reserve', 'hold', id, 'acc', acc, 'amt', amounts[1],
    'prov', provenance)
else
  redis.call('XADD', KEYS[2], '*', 'op', 'reserve', 'hold', id, 'acc', acc, 'amt', amounts[1])
end
return {'ok'}
