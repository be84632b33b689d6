-- escrow: the parent's side of a tenant split over escrow shards (ledger/escrow.py):
-- each shard is a ledger tenant of its own, in a slot of its own, whose accounts
-- hold a slice of the parent's limits; what no shard holds is the parent's
-- `unleased`. Budget moves between them only by transfers with ids, in two steps
-- on two slots: a refill is debited here first (`grant`), then credited on the shard
-- (escrow_shard.lua `apply`); a reclaim is taken from the shard first (`yield`),
-- then credited here (`receive`). A transfer between its two steps is budget in
-- flight: a crash there strands it (recover() finishes it) but never lets it be
-- spent twice.
--
-- KEYS     the tenant's accounts and journal (_lib.lua), then KEYS[3] `...:escrow`
--          (a hash: `shards`, and per account `a|<id>` its definition
--          `limit,soft,win,appr`, `n|<id>` its generation (1 at its first define, one
--          more at each after; absent, as releases before it wrote none: 0),
--          `u|<id>` its unleased amount and `v|<id>` the policy version its
--          definition came from (absent: unversioned); per grant in flight
--          `g|<xid>` = `<shard>|<account>|<amount>|<t0>`), KEYS[4]
--          `...:escrow:seen` (a sorted set: the ids of reclaims received, by the
--          Redis time their yield was taken)
-- ARGV[1]  the operation, and after it its arguments:
--   split  shard names, 1..MAX_SHARDS of them (each a tenant id)
--          -> {'ok' | 'exists'}; {'conflict', names}: split already, otherwise;
--             {'plain', n}: the tenant has n account fields of its own (nothing written)
--   define account, limit, soft limit, window_ms, approval threshold, and optionally
--          the version of the tenant's policy these limits come from ('' or none:
--          unversioned; kept as `v|<id>`): the account's limits over every shard; a
--          changed limit moves its unleased by the change (below zero: no grant until
--          reclaims bring it back)
--          -> {'ok', unleased, gen}: gen the definition's new generation, which the
--             shards' reshape is given (escrow_shard.lua keeps the newest);
--             {'kept', unleased, gen}: the account holds a newer policy version's
--             limits (nothing written; gen the generation it stands at)
--   grant  xid, shard index (0-based), account, want, least: take min(want,
--          unleased) for the shard if that is at least `least` (with 0, whatever
--          there is)
--          -> {'ok' | 'exists', amount, t0, limit, soft, win, appr, gen}: the
--             definition as it stands, for the shard's apply;
--             {'short', unleased}: nothing taken; {'unknown_account', account}
--   granted  xid: the grant was applied on its shard; forget it -> {'ok'}
--   receive  xid, shard index, account, amount, t0: a reclaim the shard yielded at
--          t0 (its Redis time) joins the unleased amount, once
--          -> {'ok' | 'exists'}; {'stale'}: older than TRANSFER_RETENTION_MS (_lib.lua,
--          7 days), refused (its id may have been forgotten here)
-- Every reply may also be {'bad_input', field, message}, nothing written.
--
-- Invariant: for every account, unleased + the shards' limits + the grants and
-- yields in flight = its limit here; a grant is taken from unleased before any
-- shard is credited with it, and a receive credits each yield once (while its id
-- is remembered, TRANSFER_RETENTION_MS; an older one is refused), so no unit of a limit is
-- ever held in two places. An account's definition never goes back to an older
-- policy version's (two hosts defining two versions in the wrong order).

local ESCROW, SEEN = KEYS[3], KEYS[4]
local MAX_SHARDS = 64
if ESCROW ~= P .. 'escrow' or SEEN ~= P .. 'escrow:seen' then
  return {'bad_input', 'keys', 'KEYS[3..4] must be the tenant escrow keys'}
end
local op = ARGV[1]

local function definition(account)
  local read = redis.call('HMGET', ESCROW, 'a|' .. account, 'n|' .. account)
  if not read[1] then
    return nil
  end
  local limit, soft, win, appr = string.match(read[1], '^(%d+),(%d+),(%d+),(%d+)$')
  return {limit = tonumber(limit), soft = tonumber(soft), win = tonumber(win),
          appr = tonumber(appr), gen = tonumber(read[2]) or 0}
end

local function shard_count()
  local names = redis.call('HGET', ESCROW, 'shards')
  return names and #split(names) or 0
end

local function shard_arg(text)
  local k = uint(text, MAX_SHARDS)
  if not k or k >= shard_count() then
    return nil
  end
  return k
end

local function account_arg(text)
  if not valid_id(text) or not string.match(text, '^%a+:.') then
    return nil
  end
  return text
end

if op == 'split' then
  local names = {}
  for i = 2, #ARGV do
    if not string.match(ARGV[i], '^[%w._-]+~e%d+x?%d*$') or #ARGV[i] > 80 then
      return {'bad_input', 'shards', 'must be shard tenant names <tenant>~e<k>[x<salt>]'}
    end
    names[#names + 1] = ARGV[i]
  end
  if #names < 1 or #names > MAX_SHARDS then
    return {'bad_input', 'shards', 'must name 1 to ' .. MAX_SHARDS .. ' shards'}
  end
  local joined = table.concat(names, ',')
  local had = redis.call('HGET', ESCROW, 'shards')
  if had then
    if had == joined then
      return {'exists'}
    end
    return {'conflict', had}
  end
  -- Accounts of its own would hold budget beside the slices (_lib.lua's escrowed).
  local own = redis.call('HLEN', ACCOUNTS)
  if own > 0 then
    return {'plain', own}
  end
  redis.call('HSET', ESCROW, 'shards', joined)
  journal({'op', 'escrow', 'act', 'split', 'shards', joined})
  return {'ok'}
end

if op == 'define' then
  local account = account_arg(ARGV[2])
  local limit, soft = uint(ARGV[3], MAX_AMOUNT), uint(ARGV[4], MAX_AMOUNT)
  local win, appr = uint(ARGV[5], MAX_AMOUNT), uint(ARGV[6], MAX_AMOUNT)
  if not account then
    return {'bad_input', 'account', 'must be kind:name of [A-Za-z0-9._:@/-], at most 128'}
  end
  if not limit or not soft or soft > limit or not win or not appr or #ARGV > 7 then
    return {'bad_input', 'limits', 'limit, soft limit <= limit, window and threshold: integers'}
  end
  local versioned = ARGV[7] and ARGV[7] ~= ''
  local pv = versioned and uint(ARGV[7], MAX_AMOUNT)
  if versioned and not pv then
    return {'bad_input', 'policy_version', 'must be a whole number'}
  end
  if shard_count() == 0 then
    return {'bad_input', 'tenant', 'is not split into escrow shards: split it first'}
  end
  local had = definition(account)
  local unleased = tonumber(redis.call('HGET', ESCROW, 'u|' .. account)) or 0
  if had and pv and (tonumber(redis.call('HGET', ESCROW, 'v|' .. account)) or 0) > pv then
    return {'kept', fmt(unleased), fmt(had.gen)}
  end
  local gen = (had and had.gen or 0) + 1
  -- The change first: both limits are exact, and so is their difference; added to
  -- unleased first, the sum could pass 2^53 and round.
  unleased = unleased + (limit - (had and had.limit or 0))
  redis.call('HSET', ESCROW, 'a|' .. account,
    fmt(limit) .. ',' .. fmt(soft) .. ',' .. fmt(win) .. ',' .. fmt(appr),
    'n|' .. account, fmt(gen), 'u|' .. account, fmt(unleased))
  if pv then
    redis.call('HSET', ESCROW, 'v|' .. account, fmt(pv))
  end
  journal({'op', 'escrow', 'act', 'define', 'acct', account, 'limit', fmt(limit),
           'unleased', fmt(unleased)})
  return {'ok', fmt(unleased), fmt(gen)}
end

local xid = ARGV[2]
if not valid_id(xid) then
  return {'bad_input', 'transfer', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end

if op == 'grant' then
  local k, account = shard_arg(ARGV[3]), account_arg(ARGV[4])
  local want, least = uint(ARGV[5], MAX_AMOUNT), uint(ARGV[6], MAX_AMOUNT)
  if not k then return {'bad_input', 'shard', 'must be the index of one of the shards'} end
  if not account then return {'bad_input', 'account', 'must be kind:name'} end
  if not want or not least or least > want or #ARGV ~= 6 then
    return {'bad_input', 'amount', 'want and least: integers, least <= want'}
  end
  local def = definition(account)
  if not def then
    return {'unknown_account', account}
  end
  local sent = redis.call('HGET', ESCROW, 'g|' .. xid)
  local status, amount, t0 = 'ok', 0, 0
  if sent then
    local sk, sa, samt, st0 = string.match(sent, '^(%d+)|([^|]+)|(%d+)|(%d+)$')
    if tonumber(sk) ~= k or sa ~= account then
      return {'bad_input', 'transfer', 'was used for another shard or account'}
    end
    status, amount, t0 = 'exists', tonumber(samt), tonumber(st0)
  else
    local unleased = tonumber(redis.call('HGET', ESCROW, 'u|' .. account)) or 0
    amount = math.min(want, unleased)
    if amount < least or amount < 0 then
      return {'short', fmt(unleased)}
    end
    t0 = now_ms()
    redis.call('HSET', ESCROW, 'u|' .. account, fmt(unleased - amount), 'g|' .. xid,
      fmt(k) .. '|' .. account .. '|' .. fmt(amount) .. '|' .. fmt(t0))
    journal({'op', 'escrow', 'act', 'grant', 'xfer', xid, 'shard', fmt(k), 'acct', account,
             'amt', fmt(amount)})
  end
  return {status, fmt(amount), fmt(t0), fmt(def.limit), fmt(def.soft), fmt(def.win),
          fmt(def.appr), fmt(def.gen)}
end

if op == 'granted' then
  redis.call('HDEL', ESCROW, 'g|' .. xid)
  return {'ok'}
end

if op == 'receive' then
  local k, account = shard_arg(ARGV[3]), account_arg(ARGV[4])
  local amount, t0 = uint(ARGV[5], MAX_AMOUNT), uint(ARGV[6], MAX_AMOUNT)
  if not k then return {'bad_input', 'shard', 'must be the index of one of the shards'} end
  if not account or not definition(account) then
    return {'bad_input', 'account', 'must be an account the tenant defined'}
  end
  if not amount or not t0 or #ARGV ~= 6 then
    return {'bad_input', 'amount', 'amount and t0: integers'}
  end
  if redis.call('ZSCORE', SEEN, xid) then
    return {'exists'}
  end
  local now = now_ms()
  if t0 < now - TRANSFER_RETENTION_MS then
    return {'stale'}
  end
  redis.call('HINCRBY', ESCROW, 'u|' .. account, fmt(amount))
  redis.call('ZADD', SEEN, fmt(t0), xid)
  redis.call('ZREMRANGEBYSCORE', SEEN, '-inf', '(' .. fmt(now - TRANSFER_RETENTION_MS))
  journal({'op', 'escrow', 'act', 'receive', 'xfer', xid, 'shard', fmt(k), 'acct', account,
           'amt', fmt(amount)})
  return {'ok'}
end

return {'bad_input', 'operation', 'must be split, define, grant, granted or receive'}
