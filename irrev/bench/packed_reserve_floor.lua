-- packed_reserve_floor: what reserve_floor.lua runs, in a packed layout that keeps the
-- same information in fewer, cheaper values: the hold's record one string, each
-- account one field. It is not the ledger's layout (nothing reads it): it measures
-- what the ledger's admitting reserve could cost in that layout, beside today's floor
-- (`irrev bench ledger`). Unlike reserve_floor.lua it also does the Lua work the
-- packing adds (reading the packed numbers and printing them back), and it keeps the
-- balances right, so that tests/ledger/test_bench_floor.py can check that what it
-- writes holds everything today's record and accounts hold.
--
-- The layout:
--   an account: the field `<account id>` of the accounts hash, `limit,soft,win,appr,
--     pend,post,ws,over` (decimal integers); its temporary raises stay in
--     `<account id>|raise` (rare; read in the same HMGET)
--   a hold: its record key is a string, `st|fp|arm|t0|dl|acc|amt|why|lim|used` (no id
--     or fingerprint has a '|' or a ','; acc, amt, lim and used are comma lists)
--
-- KEYS     reserve.lua's: accounts, journal, deadlines, ambiguous, escalated, hold,
--          payload, settled
-- ARGV     reserve.lua's (the bench's reserves: no account to open, no pool), of
--          which it reads the hold id (1), fingerprint (2), ttl_ms (3), armed (5),
--          request (8), provenance (9), n (10) and the n pairs of account id and amount
--
-- Returns {'ok'}; {'exists'} if the hold's record is there (nothing written);
-- {'unknown_account', id} if an account has no packed field (nothing written).
--
-- Invariant: none of the ledger's (no checks, no decision: every reserve is admitted);
-- an account's pend rises by the hold's amount on it, in the same script as the
-- record is written.

-- Redis 6.2 writes after TIME only under effects replication (7 always replicates so).
redis.replicate_commands()
local id, request, provenance, n = ARGV[1], ARGV[8], ARGV[9], tonumber(ARGV[10])
local accounts, amounts, names = {}, {}, {}
for i = 1, n do
  local account = ARGV[9 + 2 * i]
  accounts[i], amounts[i] = account, tonumber(ARGV[10 + 2 * i])
  names[2 * i - 1], names[2 * i] = account, account .. '|raise'
end
if redis.call('GET', KEYS[6]) then
  return {'exists'}
end
redis.call('HGET', KEYS[8], ARGV[1])
local v = redis.call('HMGET', KEYS[1], unpack(names))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The bench's reserves are a batch's items (Ledger.reserve_many), which look for due
-- holds before deciding; an admitted single reserve does without.
redis.call('ZRANGE', KEYS[3], '0', '0', 'WITHSCORES')
local balances, limits, used = {}, {}, {}
for i = 1, n do
  local packed = v[2 * i - 1]
  if not packed then
    return {'unknown_account', accounts[i]}
  end
  local limit, soft, win, appr, pend, post, ws, over =
    string.match(packed, '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)$')
  pend, post = tonumber(pend), tonumber(post)
  limits[i], used[i] = limit, string.format('%d', pend + post)
  balances[2 * i - 1] = accounts[i]
  balances[2 * i] = table.concat({limit, soft, win, appr, string.format('%d', pend + amounts[i]),
    string.format('%d', post), ws, over}, ',')
end
local deadline = string.format('%d', now + tonumber(ARGV[3]))
local acc, amt = table.concat(accounts, ','), table.concat(amounts, ',')
redis.call('SET', KEYS[6], table.concat({'pending', ARGV[2], ARGV[5], string.format('%d', now),
  deadline, acc, amt, 'within_budget', table.concat(limits, ','), table.concat(used, ',')}, '|'))
if #request > 0 then
  redis.call('SET', KEYS[7], request)
else
  redis.call('DEL', KEYS[7])
end
redis.call('HSET', KEYS[1], unpack(balances))
redis.call('ZADD', KEYS[3], deadline, id)
if #provenance > 0 then
  redis.call('XADD', KEYS[2], '*', 'op', 'reserve', 'hold', id, 'acc', acc, 'amt', amounts[1],
    'prov', provenance)
else
  redis.call('XADD', KEYS[2], '*', 'op', 'reserve', 'hold', id, 'acc', acc, 'amt', amounts[1])
end
return {'ok'}
