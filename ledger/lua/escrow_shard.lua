-- escrow_shard: a shard's side of the transfers of escrow.lua (ledger/escrow.py).
-- A shard is a ledger tenant of its own whose accounts hold a slice of the parent's
-- limits; these two steps are the only writes of its limits.
--
-- KEYS     the shard's accounts and journal (_lib.lua), then KEYS[3] `...:escrow` (a
--          hash: per reclaim in flight `y|<xid>` = `<account>|<amount>|<t0>`; per
--          account `d|<id>` = `gen,limit,soft,win,appr`, the newest of the parent's
--          definitions a reshape or an apply brought here), KEYS[4]
--          `...:escrow:seen` (a sorted set: the ids of grants applied, by the Redis
--          time the parent took them)
-- ARGV[1]  the operation, and after it its arguments:
--   apply  xid, account, amount, t0 (the parent's Redis time of the grant), the
--          parent's limit, soft limit, window_ms and approval threshold of the
--          account, and optionally their generation (escrow.lua's define; absent: 0):
--          raise the account's slice by `amount`, once (opening it, with zero
--          balances, if missing); its soft limit is the parent's share of it,
--          floor(slice x soft / limit)
--          -> {'ok' | 'exists', slice}; {'stale'}: t0 is older than
--          TRANSFER_RETENTION_MS (_lib.lua, 7 days), not applied (its id may have been
--          forgotten here), the grant stays stranded
--   open   xid (any: not remembered), account, the parent's window_ms and approval
--          threshold: open the account with a slice of 0 if it is missing (its slice
--          comes by refills), so that racing openers cannot take a chunk each
--          -> {'ok' | 'exists'}
--   reshape  xid (any: not remembered), account, the parent's limit, soft limit,
--          window_ms and approval threshold, as the parent now defines them, and
--          optionally their generation: the slice's soft limit, window and threshold
--          follow (its slice does not move)
--          -> {'ok'}; {'exists'}: no such account here (the definition is kept for it)
--   yield  xid, account, want, keep, the parent's limit and soft limit, and optionally
--          their generation: give back
--          min(want, room - keep), once, where room is what the slice has above both
--          what it holds pending and posted this window and the slice whose share
--          below the soft limit covers that (never below 0)
--          -> {'ok' | 'exists', amount, t0}: t0 this shard's Redis time of the yield
--   yielded  xid: the parent received it; forget it -> {'ok'}
-- Every reply may also be {'bad_input', field, message}, nothing written.
--
-- Invariant: a slice never falls below what its account holds (pending + posted),
-- so every admission the shard made stays within its limit (contract 1), nor below
-- the slice whose soft share covers it, so what the shards hold within their bands
-- adds up to at most the tenant's soft limit; and each
-- grant raises it once (while its id is remembered, TRANSFER_RETENTION_MS; an older one is
-- refused). Every change is journaled as an `account` entry, so the shard's own
-- journal replays its limits (contract 7). Each step shapes the slice by the newest
-- definition this shard has been given, whatever the step carries (`d|`): a transfer
-- that began before a define, in another process, never puts the older soft limit,
-- window or threshold back (a stale copy never undoes a newer change).

local ESCROW, SEEN = KEYS[3], KEYS[4]
if ESCROW ~= P .. 'escrow' or SEEN ~= P .. 'escrow:seen' then
  return {'bad_input', 'keys', 'KEYS[3..4] must be the shard escrow keys'}
end
local op, xid = ARGV[1], ARGV[2]
if not valid_id(xid) then
  return {'bad_input', 'transfer', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
if op == 'yielded' then
  redis.call('HDEL', ESCROW, 'y|' .. xid)
  return {'ok'}
end
local account = ARGV[3]
if not valid_id(account) or not string.match(account, '^%a+:.') then
  return {'bad_input', 'account', 'must be kind:name of [A-Za-z0-9._:@/-], at most 128'}
end

-- A step's optional last argument, the generation of the definition it carries.
local function gen_arg(i)
  if ARGV[i] == nil then
    return 0
  end
  return uint(ARGV[i], MAX_AMOUNT)
end

-- The definition a step shapes the slice by: the one it carries (`given`: gen, limit
-- and soft, with win and appr but in a yield's), unless this shard holds a newer one.
-- A complete and newer one is kept as the newest.
local function newest(given)
  local text = redis.call('HGET', ESCROW, 'd|' .. account)
  if text then
    local g, l, s, w, a = string.match(text, '^(%d+),(%d+),(%d+),(%d+),(%d+)$')
    if tonumber(g) > given.gen then
      return {gen = tonumber(g), limit = tonumber(l), soft = tonumber(s), win = tonumber(w),
              appr = tonumber(a)}
    end
    if tonumber(g) == given.gen then
      return given
    end
  end
  if given.limit and given.win then
    redis.call('HSET', ESCROW, 'd|' .. account, fmt(given.gen) .. ',' .. fmt(given.limit)
      .. ',' .. fmt(given.soft) .. ',' .. fmt(given.win) .. ',' .. fmt(given.appr))
  end
  return given
end

-- The parent's share of `slice` below its soft limit, floor(slice x soft / limit),
-- never above it: the shares of all the slices must add up to at most the soft limit.
-- Exact while slice x soft is an exact double (below 2^53: the quotient of two exact
-- integers, correctly rounded, floors to the exact floor); past that, one double
-- product is off by at most 2, so the share is taken 2 lower.
local function soft_share(slice, limit, soft)
  if limit <= 0 or soft >= limit then
    return slice
  end
  if slice * soft < 2 ^ 53 then
    return math.floor(slice * soft / limit)
  end
  return math.max(math.min(math.floor(slice * (soft / limit)) - 2, slice), 0)
end

-- The least slice whose share covers `used` (a reclaim keeps it), or the whole of
-- MAX_AMOUNT where doubles cannot find it: keeping more is the safe side. Bounded: a
-- loop that adds 1 to a number past 2^53 would never end (and hang Redis).
local function soft_cover(used, limit, soft)
  if soft <= 0 or soft >= limit then
    return used
  end
  local kept = math.ceil(used * (limit / soft))
  for _ = 1, 3 do
    if soft_share(kept, limit, soft) >= used then
      return math.max(kept, used)
    end
    kept = kept + 1
  end
  return MAX_AMOUNT
end

local function write(a, xid_field)
  a.policy = true
  save_accounts({a})
  journal({'op', 'account', 'acct', a.id, 'limit', fmt(a.limit), 'soft', fmt(a.soft),
           'win', fmt(a.win), 'appr', fmt(a.appr), 'ws', fmt(a.ws), 'xfer', xid_field})
end

if op == 'open' then
  local win, appr = uint(ARGV[4], MAX_AMOUNT), uint(ARGV[5], MAX_AMOUNT)
  if not win or not appr or #ARGV ~= 5 then
    return {'bad_input', 'arguments', 'open takes an account, window_ms and a threshold'}
  end
  if load_account(account) then
    return {'exists'}
  end
  local d = newest({gen = 0, win = win, appr = appr})
  local now = now_ms()
  write({id = account, limit = 0, soft = 0, win = d.win, appr = d.appr, pend = 0, post = 0,
         over = 0, ws = d.win > 0 and now - (now % d.win) or 0}, xid)
  return {'ok'}
end

if op == 'reshape' then
  local limit, soft = uint(ARGV[4], MAX_AMOUNT), uint(ARGV[5], MAX_AMOUNT)
  local win, appr, gen = uint(ARGV[6], MAX_AMOUNT), uint(ARGV[7], MAX_AMOUNT), gen_arg(8)
  if not limit or not soft or soft > limit or not win or not appr or not gen or #ARGV > 8 then
    return {'bad_input', 'arguments', 'reshape takes an account and its limits (soft <= '
      .. 'limit), window_ms, threshold and generation, as integers'}
  end
  local d = newest({gen = gen, limit = limit, soft = soft, win = win, appr = appr})
  local a = load_account(account)
  if not a then
    return {'exists'}
  end
  local now = now_ms()
  roll(a, now)
  if d.win ~= a.win then
    a.ws = d.win > 0 and now - (now % d.win) or 0
  end
  a.soft, a.win, a.appr = soft_share(a.limit, d.limit, d.soft), d.win, d.appr
  write(a, xid)
  return {'ok'}
end

if op == 'apply' then
  local amount, t0 = uint(ARGV[4], MAX_AMOUNT), uint(ARGV[5], MAX_AMOUNT)
  local limit, soft = uint(ARGV[6], MAX_AMOUNT), uint(ARGV[7], MAX_AMOUNT)
  local win, appr, gen = uint(ARGV[8], MAX_AMOUNT), uint(ARGV[9], MAX_AMOUNT), gen_arg(10)
  if not amount or not t0 or not limit or not soft or soft > limit or not win or not appr
      or not gen or #ARGV > 10 then
    return {'bad_input', 'arguments', 'apply takes a transfer, an account, its amount, t0 '
      .. 'and the limits (soft <= limit) and their generation, as integers'}
  end
  if redis.call('ZSCORE', SEEN, xid) then
    local had = load_account(account)
    return {'exists', fmt(had and had.limit or 0)}
  end
  local now = now_ms()
  if t0 < now - TRANSFER_RETENTION_MS then
    return {'stale'}
  end
  local a = load_account(account)
  if a and a.limit + amount > MAX_AMOUNT then
    return {'bad_input', 'amount', 'would take the slice past 2^53-1'}
  end
  local d = newest({gen = gen, limit = limit, soft = soft, win = win, appr = appr})
  if a then
    roll(a, now)
  else
    a = {id = account, limit = 0, pend = 0, post = 0, over = 0,
         ws = d.win > 0 and now - (now % d.win) or 0}
  end
  a.limit = a.limit + amount
  a.soft, a.win, a.appr = soft_share(a.limit, d.limit, d.soft), d.win, d.appr
  write(a, xid)
  redis.call('ZADD', SEEN, fmt(t0), xid)
  redis.call('ZREMRANGEBYSCORE', SEEN, '-inf', '(' .. fmt(now - TRANSFER_RETENTION_MS))
  return {'ok', fmt(a.limit)}
end

if op == 'yield' then
  local want, keep = uint(ARGV[4], MAX_AMOUNT), uint(ARGV[5], MAX_AMOUNT)
  local limit, soft, gen = uint(ARGV[6], MAX_AMOUNT), uint(ARGV[7], MAX_AMOUNT), gen_arg(8)
  if not want or not keep or not limit or not soft or soft > limit or not gen
      or #ARGV > 8 then
    return {'bad_input', 'arguments', 'yield takes a transfer, an account, want, keep and '
      .. 'the limits (soft <= limit) and their generation, as integers'}
  end
  local had = redis.call('HGET', ESCROW, 'y|' .. xid)
  if had then
    local ha, amount, t0 = string.match(had, '^([^|]+)|(%d+)|(%d+)$')
    if ha ~= account then
      return {'bad_input', 'transfer', 'was used for another account'}
    end
    return {'exists', amount, t0}
  end
  local now = now_ms()
  local a = load_account(account)
  if not a then
    return {'ok', '0', fmt(now)}
  end
  roll(a, now)
  local d = newest({gen = gen, limit = limit, soft = soft})
  -- What the slice must keep: what it holds, and the slice whose share below the soft
  -- limit still covers it. Every shard then holds no more than its share of the band,
  -- and the shares add up to at most the soft limit: the band holds over the tenant.
  local kept = soft_cover(a.pend + a.post, d.limit, d.soft)
  local room = math.max(a.limit - kept, 0)
  local amount = math.min(want, math.max(room - keep, 0))
  if amount == 0 then
    save_accounts({a})
    return {'ok', '0', fmt(now)}
  end
  a.limit = a.limit - amount
  a.soft = soft_share(a.limit, d.limit, d.soft)
  write(a, xid)
  redis.call('HSET', ESCROW, 'y|' .. xid, account .. '|' .. fmt(amount) .. '|' .. fmt(now))
  return {'ok', fmt(amount), fmt(now)}
end

return {'bad_input', 'operation', 'must be open, reshape, apply, yield or yielded'}
