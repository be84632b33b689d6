-- post_floor: the Redis commands ledger/lua/post.lua runs to post a pending hold at
-- one amount for every account, without an outcome (as the bench posts), in its
-- order, on the same keys and with as many arguments, but none of its checks,
-- arithmetic or state machine: what no post that keeps the same records can go
-- below (`irrev bench ledger` times it beside post and the trivial script). Only for
-- a tenant of the bench's own: it writes made-up balances.
--
-- KEYS     post.lua's: accounts, journal, deadlines, ambiguous, escalated, hold,
--          payload
-- ARGV     post.lua's for one amount: hold id, retention_ms, outcome (''), no
--          allowance ('', '', ''), '*', amount
--
-- Returns {'ok', 'posted', ''}.
--
-- Invariant: none of the ledger's; tests/ledger/test_bench_floor.py checks that it
-- issues the same commands, on the same keys, with the same number of arguments
-- each, as post.lua.

-- Redis 6.2 writes after TIME only under effects replication (7 always replicates so).
redis.replicate_commands()
local id, retention, amount = ARGV[1], ARGV[2], ARGV[8]
local hold = redis.call('HMGET', KEYS[6], 'st', 'acc', 'amt', 'pst', 'cr')
local now = redis.call('TIME')[1] .. '000'
local names, balances, posted, windows = {}, {}, {}, {}
for account in string.gmatch(hold[2], '[^,]+') do
  local at, i = #names, #posted + 1
  names[at + 1], names[at + 2] = account .. '|pend', account .. '|post'
  names[at + 3], names[at + 4] = account .. '|win', account .. '|ws'
  balances[4 * i - 3], balances[4 * i - 2] = names[at + 1], '0'
  balances[4 * i - 1], balances[4 * i] = names[at + 2], amount
  posted[i], windows[i] = amount, '0'
end
redis.call('HMGET', KEYS[1], unpack(names))
redis.call('HSET', KEYS[1], unpack(balances))
redis.call('DEL', KEYS[7])
redis.call('HSET', KEYS[6], 'st', 'posted', 'pst', table.concat(posted, ','), 'pws',
  table.concat(windows, ','), 'tp', now)
redis.call('ZREM', KEYS[3], id)
if tonumber(retention) > 0 then
  redis.call('PEXPIRE', KEYS[6], retention)
end
redis.call('XADD', KEYS[2], '*', 'op', 'post', 'hold', id, 'acc', hold[2], 'pst', amount,
  'rel', string.match(hold[3], '^[^,]+'))
return {'ok', 'posted', ''}
