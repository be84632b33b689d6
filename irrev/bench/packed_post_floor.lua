-- packed_post_floor: what post_floor.lua runs, in packed_reserve_floor.lua's layout
-- (the record one string, each account one field), on a hold that script reserved:
-- the record's state change and its retention become one SET, and the Lua work the
-- packing adds (reading the packed numbers, printing them back) is done. Not the
-- ledger's layout: `irrev bench ledger` times it beside post's floor.
--
-- KEYS     post.lua's: accounts, journal, deadlines, ambiguous, escalated, hold,
--          payload
-- ARGV     post.lua's for one amount: hold id, retention_ms, outcome (''), no
--          allowance ('', '', ''), '*', amount
--
-- Returns {'ok', 'posted', ''}; {'not_found'} if the hold has no packed record or is
-- not pending (nothing written).
--
-- Invariant: none of the ledger's (no window roll, no overrun count); each of the
-- hold's accounts moves its amount out of pend and the posted amount into post, in
-- the same script as the record becomes posted.

-- Redis 6.2 writes after TIME only under effects replication (7 always replicates so).
redis.replicate_commands()
local id, retention, amount = ARGV[1], tonumber(ARGV[2]), ARGV[8]
local record = redis.call('GET', KEYS[6])
local st, rest, acc, amt, tail
if record then
  st, rest = string.match(record, '^([^|]+)(|.*)$')
  acc, amt = string.match(rest, '^|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|([^|]*)|')
end
if st ~= 'pending' or not acc then
  return {'not_found'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local accounts, held = {}, {}
for account in string.gmatch(acc, '[^,]+') do
  accounts[#accounts + 1] = account
end
for a in string.gmatch(amt, '[^,]+') do
  held[#held + 1] = tonumber(a)
end
local v = redis.call('HMGET', KEYS[1], unpack(accounts))
local balances, posted, windows = {}, {}, {}
for i = 1, #accounts do
  local limit, soft, win, appr, pend, post, ws, over =
    string.match(v[i], '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)$')
  balances[2 * i - 1] = accounts[i]
  balances[2 * i] = table.concat({limit, soft, win, appr,
    string.format('%d', tonumber(pend) - held[i]),
    string.format('%d', tonumber(post) + tonumber(amount)), ws, over}, ',')
  posted[i], windows[i] = amount, ws
end
redis.call('HSET', KEYS[1], unpack(balances))
redis.call('DEL', KEYS[7])
tail = table.concat({table.concat(posted, ','), table.concat(windows, ','),
  string.format('%d', now)}, '|')
if retention > 0 then
  redis.call('SET', KEYS[6], 'posted' .. rest .. '|' .. tail, 'PX', ARGV[2])
else
  redis.call('SET', KEYS[6], 'posted' .. rest .. '|' .. tail)
end
redis.call('ZREM', KEYS[3], id)
redis.call('XADD', KEYS[2], '*', 'op', 'post', 'hold', id, 'acc', acc, 'pst', amount,
  'rel', string.match(amt, '^[^,]+'))
return {'ok', 'posted', ''}
