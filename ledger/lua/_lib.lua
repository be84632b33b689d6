-- Shared helpers of every ledger operation. On Redis 7 they are the top of one
-- Redis Functions library (ledger/scripts.py), loaded once, and each operation's
-- file becomes the body of a function of it; on Redis 6.2 the helpers an operation
-- uses are prepended to its file, which is run by EVALSHA. Not a script on its own.
--
-- Key layout: every key a script reads or writes is declared in KEYS, so that
-- during a slot migration Redis runs a script only where all of them are (else it
-- answers TRYAGAIN, and the client tries again) and never on a node that holds half
-- of a tenant. All of a tenant's keys carry the `{<tenant>}` hash tag: one slot.
--   KEYS[1]  `irrev:{<tenant>}:accounts`, one hash of every account of the tenant
--            (fields `<account id>|<limit, soft, win, appr, pend, post, ws, over>`)
--   KEYS[2]  `...:journal`, KEYS[3] `...:deadlines`, KEYS[4] `...:ambiguous`,
--            KEYS[5] `...:escalated` (the scripts of one hold declare all five)
--            Besides the accounts, it keeps the open holds of each calibrating
--            route (pricing/calibration.py), under its short tag (reserve.lua):
--            `~<tag>|n` how many, `~<tag>|s` the sum of their face values, `~<tag>|q`
--            the sum of their squares (HINCRBYFLOAT: a float, reset with the others
--            when the count reaches 0, so its rounding never outlives the set; read
--            within its bounds, `kish`). No
--            account id starts with '~' (valid_id), and a reserve of a calibrating
--            route must count its hold in the same script as its balances: this is
--            the one hash every hold script already declares. A hold is open while
--            pending or ambiguous (it may have happened at any loss); an escalated
--            one joins when approved; compensate and trueup act on posted holds, out
--            of the set already.
--   KEYS[6]  `...:hold:<id>`, the hold the script is about (ARGV[1] is its id)
--   KEYS[7]  `...:payload:<id>`, the bytes the hold keeps (a string of its own: in
--            the record, one value over 64 bytes would make Redis keep the whole
--            hash as a table, three times the memory, for the hold's life): the
--            request while it is live, still when it is rejected or expired (the
--            gateway shows whose it was), the upstream's answer (outcome) once it is
--            posted or voided if it is over INLINE_OUTCOME bytes, or nothing. It
--            lives as the record does: no TTL while the hold is live, the record's
--            retention once it is settled. An outcome of at most INLINE_OUTCOME
--            bytes is kept in the record instead, cut into fields o1, o2, ... of
--            under 64 bytes each (settle_fields): a settled hold is then one key,
--            not two (a key and its TTL cost ~100-150 bytes of their own)
--   KEYS[8]  `...:kept:<agent>` (post, void: only with an allowance, settle_args),
--            the bytes of answers kept whole for the agent's repeats in the current
--            UTC day; it expires at the day's end (kept_within)
-- A script builds no key of its own but checks the keys it was given: KEYS[1..5]
-- are the tenant's (bind), any other key is of the same tenant (bind) and a hold's
-- keys are the ones its id names (hold_id_arg), so a caller cannot point it
-- elsewhere.
--
-- Numbers: amounts are integers in [0, 2^53 - 1], exact in a Lua double. Lua's
-- tostring() and `..` print 14 significant digits, so numbers that go into strings
-- pass through fmt(); numbers passed to redis.call are printed by Redis with 17.

-- The call's KEYS and ARGV and the tenant's keys, set by `bind` at the start of
-- every call (a function gets its keys and arguments as parameters, and a library
-- has no globals of its own).
local KEYS, ARGV, ACCOUNTS, P, JOURNAL, DEADLINES, AMBIGUOUS, ESCALATED

-- `make` with what it returns kept per key (`make(key, arg)`: `arg` must follow
-- from `key`), for the names scripts make from their keys and arguments. A Functions
-- library keeps its state until it is loaded again (Redis 7), so what is made once
-- serves every later call. Bounded: past MAX_NAMED keys it starts again. Lua's memory
-- is not counted against maxmemory, and caches of 4,096 entries of 8 long account ids
-- each reached ~56 MB in a hostile review: 512 keep them to a few MB at worst. On
-- Redis 6.2 a script's top level runs on every call, so a cache would only cost: the
-- EVALSHA form (ledger/lua/_eval.lua) returns `make` itself.
local MAX_NAMED = 512

local function remembering(make)
  local cache, size = {}, 0
  return function(key, arg)
    local v = cache[key]
    if v == nil then
      if size >= MAX_NAMED then
        cache, size = {}, 0
      end
      v = make(key, arg)
      cache[key], size = v, size + 1
    end
    return v
  end
end

-- The tenant's keys by its accounts key (KEYS[1]): [1] the prefix of all of them,
-- `irrev:{<tenant>}:`, and [2..5] its journal, deadlines, ambiguous and escalated
-- keys, remembered: bind compares a call's keys with them instead of making them.
local tenant_keys = remembering(function(accounts)
  local p = string.match(accounts, '^(irrev:{[^}]+}:)accounts$')
  if not p then
    error('irrev: KEYS[1] must be a tenant accounts key irrev:{<tenant>}:accounts')
  end
  return {p, p .. 'journal', p .. 'deadlines', p .. 'ambiguous', p .. 'escalated'}
end)

-- `standard`: how many of KEYS[1..5] the operation takes (ledger/scripts.py). Those
-- must be the tenant's keys, in order, and every other key must be the tenant's
-- too: a caller cannot make a script write another tenant's journal or queues.
-- Nothing has been written when it fails, so an error reply is safe.
local function bind(keys, argv, standard)
  KEYS, ARGV = keys, argv
  ACCOUNTS, JOURNAL, DEADLINES, AMBIGUOUS, ESCALATED = keys[1], keys[2], keys[3], keys[4], keys[5]
  local tenant = tenant_keys(ACCOUNTS or '')
  P = tenant[1]
  for i = 2, standard do
    if keys[i] ~= tenant[i] then
      error('irrev: KEYS[' .. i .. '] must be ' .. tenant[i])
    end
  end
  for i = standard + 1, #keys do
    if string.sub(keys[i], 1, #P) ~= P then
      error('irrev: KEYS[' .. i .. '] must be a key of the tenant of KEYS[1]')
    end
  end
end

-- Several calls of one operation in one (ledger/group.py coalesces a tenant's
-- concurrent reserves, and posts, into one): KEYS the `standard` keys of the tenant
-- once, then each call's own keys in turn; ARGV[1] the number of calls n (1..
-- MAX_GROUP), then n pairs (how many keys of its own, how many arguments), then
-- every call's arguments in turn. Every call's keys are checked (bind) before the
-- first call runs, so a group that fails to bind wrote nothing. Each call then runs
-- as it would alone, in order, and its reply is the group's reply at its place: one
-- script call pays Redis's fixed cost per command once for all of them.
local MAX_GROUP = 256

local function grouped(keys, argv, standard, run)
  local n = tonumber(argv[1])
  if not n or n < 1 or n > MAX_GROUP or n % 1 ~= 0 or #argv < 1 + 2 * n then
    error('irrev: ARGV[1] must be the number of calls of the group (1..' .. MAX_GROUP
      .. '), followed by two counts per call')
  end
  local shared = {}
  for i = 1, standard do
    shared[i] = keys[i]
  end
  local calls, k, a = {}, standard, 1 + 2 * n
  for i = 1, n do
    local nk, na = tonumber(argv[2 * i]), tonumber(argv[2 * i + 1])
    if not nk or not na or nk < 0 or na < 0 or k + nk > #keys or a + na > #argv then
      error('irrev: call ' .. i .. ' of the group names more keys or arguments than sent')
    end
    local ck, ca = {unpack(shared)}, {}
    for j = 1, nk do
      ck[standard + j] = keys[k + j]
    end
    for j = 1, na do
      ca[j] = argv[a + j]
    end
    k, a = k + nk, a + na
    bind(ck, ca, standard)
    calls[i] = {ck, ca}
  end
  if k ~= #keys or a ~= #argv then
    error('irrev: the group sent keys or arguments that no call names')
  end
  local replies = {}
  for i = 1, n do
    bind(calls[i][1], calls[i][2], standard)
    replies[i] = run()
  end
  return replies
end

local MAX_AMOUNT = 9007199254740991
-- How long each side of an escrow's transfers remembers an id it received (escrow.lua,
-- escrow_shard.lua): a step sent later is refused as stale. One constant, not the
-- caller's: a caller's shorter one would trim ids another caller's retry still needs.
local TRANSFER_RETENTION_MS = 7 * 24 * 3600 * 1000
local MAX_ACCOUNTS = 8
local MAX_BLOB = 1048576
local MAX_PROVENANCE = 16384
local MAX_NOTE = 2048 -- a person's note on a decision (approve, reject, resolve)
-- A hold's decision follows from its reason (the record keeps only the reason).
local DECISION = {within_budget = 'admit', budget_exceeded = 'deny', over_limit = 'deny',
  soft_band = 'escalate', approval_threshold = 'escalate', escalation_cap = 'deny',
  account_cap = 'deny'}

local function fmt(n)
  if n == 0 then
    return '0'
  end
  return string.format('%d', n)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether a hold of the tenant is due at `now`: the earliest deadline only, cheaper
-- than counting the due ones.
local function holds_due(now)
  local first = redis.call('ZRANGE', DEADLINES, '0', '0', 'WITHSCORES')
  return first[2] ~= nil and tonumber(first[2]) <= now
end

-- A decimal string of digits only, at most `max`; nil for anything else.
local function uint(s, max)
  if type(s) ~= 'string' or #s == 0 or #s > 16 or not string.find(s, '^%d+$') then
    return nil
  end
  local n = tonumber(s)
  if n > max then
    return nil
  end
  return n
end

local function valid_id(s)
  return type(s) == 'string' and #s >= 1 and #s <= 128
    and string.find(s, '^[%w%._:@/%-]+$') ~= nil
end

-- Whether this tenant is split over escrow shards (escrow.lua's `split`) or is one of
-- them ('~e' is in no other tenant id: ledger/keys.py shard_tenant). Their accounts
-- hold slices that only the escrow's transfers move: an account a plain script
-- defined or opened there would hold budget beside them, which no audit counts.
local function escrowed()
  return string.find(P, '~e', 1, true) ~= nil
    or redis.call('HEXISTS', P .. 'escrow', 'shards') == 1
end

local function split(s)
  local out = {}
  if s then
    for part in string.gmatch(s, '[^,]+') do
      out[#out + 1] = part
    end
  end
  return out
end

local function split_numbers(s)
  local out = split(s)
  for i = 1, #out do
    out[i] = tonumber(out[i])
  end
  return out
end

local function join_numbers(t)
  local out = {}
  for i = 1, #t do
    out[i] = fmt(t[i])
  end
  return table.concat(out, ',')
end

-- Per-account amounts as a journal entry keeps them: one number when every account
-- has the same (the common case: bytes in every entry kept), else one per account
-- (JournalEntry.deltas reads both). `joined`: join_numbers(t), where the caller has
-- it already (the record keeps the same text).
local function journal_numbers(t, joined)
  for i = 2, #t do
    if t[i] ~= t[1] then
      return joined or join_numbers(t)
    end
  end
  if #t == 0 then
    return '' -- a free hold that kept no account (reserve.lua)
  end
  return fmt(t[1])
end

local function hkey(id)
  return P .. 'hold:' .. id
end

local function pkey(id)
  return P .. 'payload:' .. id
end

-- Whether hold `id`, not in the slot, was settled and archived out of it (the
-- tenant's settled index `settled`, archive.lua) and its retention lasts (0: for
-- good): its id stays taken, as opening it again would admit its effect twice.
local function archived_id(settled, id)
  local kept = string.match(redis.call('HGET', settled, id) or '', '^(%d+)|')
  return kept ~= nil and (kept == '0' or tonumber(kept) > now_ms())
end

-- An account is eight fields of ACCOUNTS, `<account id>|<name>` (no id has a '|'),
-- each a decimal integer: read as numbers, written as numbers (no string packing,
-- which cost a Lua script ~10 us per account).
-- A balance change writes pend, post, ws and over (save_accounts); a new account or a
-- policy change writes all eight.
local ACCOUNT_FIELDS = {'limit', 'soft', 'win', 'appr', 'pend', 'post', 'ws', 'over'}

-- An account's field `name` in ACCOUNTS: `<account id>|<name>`. On Redis 7 each
-- account's names are made once and kept between calls (names_of): making the
-- strings anew on every call (each one allocated, hashed and later collected) was
-- ~6 us of a reserve's ~55. The EVALSHA form (Redis 6.2, ledger/lua/_eval.lua) makes
-- only the name asked for: there a cache would be built and dropped on every call.
local names_of = remembering(function(id)
  return {limit = id .. '|limit', soft = id .. '|soft', win = id .. '|win',
    appr = id .. '|appr', pend = id .. '|pend', post = id .. '|post', ws = id .. '|ws',
    over = id .. '|over', raise = id .. '|raise', esc = id .. '|esc', escmax = id .. '|escmax',
    nfa = id .. '|nfa', nfamax = id .. '|nfamax', rte = id .. '|rte', rtr = id .. '|rtr',
    pv = id .. '|pv'}
end)

local function field(id, name)
  return names_of(id)[name]
end

-- The accounts named by `ids`, in their order, in one HMGET (nil where missing).
-- `without_overruns`: all but `over` (nil then; save_accounts leaves it alone), for
-- a script that does not count overruns: each field read costs script time.
local function load_accounts(ids, without_overruns)
  local names, width, k = {}, without_overruns and 7 or 8, 0
  for i = 1, #ids do
    for j = 1, width do
      k = k + 1
      names[k] = field(ids[i], ACCOUNT_FIELDS[j])
    end
  end
  if #ids == 0 then
    return {}
  end
  local v = redis.call('HMGET', ACCOUNTS, unpack(names))
  local out = {}
  for i = 1, #ids do
    local at = width * (i - 1)
    if v[at + 1] then
      local a = {
        id = ids[i], limit = tonumber(v[at + 1]), soft = tonumber(v[at + 2]),
        win = tonumber(v[at + 3]), appr = tonumber(v[at + 4]), pend = tonumber(v[at + 5]),
        post = tonumber(v[at + 6]), ws = tonumber(v[at + 7]),
        over = not without_overruns and tonumber(v[at + 8]) or nil,
      }
      a.pend0, a.post0, a.ws0, a.over0 = a.pend, a.post, a.ws, a.over
      out[i] = a
    end
  end
  return out
end

-- What reserve reads of each account: load_accounts' fields but `over`, and the
-- account's temporary raises (lua/rule.lua), in the same HMGET (a second HMGET for
-- the raises cost reserve ~3 us).
-- The HMGET's field list per list of accounts (`set`, their ids joined by ',';
-- `ids`, the list), remembered: a caller reserves on the same few lists.
local reserve_names = remembering(function(set, ids)
  local names = {}
  for i = 1, #ids do
    local id, at = ids[i], 9 * (i - 1)
    names[at + 1], names[at + 2] = field(id, 'limit'), field(id, 'soft')
    names[at + 3], names[at + 4] = field(id, 'win'), field(id, 'appr')
    names[at + 5], names[at + 6] = field(id, 'pend'), field(id, 'post')
    names[at + 7], names[at + 8] = field(id, 'ws'), field(id, 'raise')
    names[at + 9] = field(id, 'rte')
  end
  return names
end)

-- The accounts named by `ids` (joined: `set`) as load_accounts(ids, true) reads
-- them, the text of each one's `raise` field and of its effect rate (`rte`, false
-- where none: account.lua, lua/rate.lua's form), all in the order of `ids`.
local function load_for_reserve(ids, set)
  local v = redis.call('HMGET', ACCOUNTS, unpack(reserve_names(set, ids)))
  local out, raises, rates = {}, {}, {}
  for i = 1, #ids do
    local at = 9 * (i - 1)
    raises[i], rates[i] = v[at + 8], v[at + 9]
    if v[at + 1] then
      local pend, post, ws = tonumber(v[at + 5]), tonumber(v[at + 6]), tonumber(v[at + 7])
      out[i] = {
        id = ids[i], limit = tonumber(v[at + 1]), soft = tonumber(v[at + 2]),
        win = tonumber(v[at + 3]), appr = tonumber(v[at + 4]), pend = pend, post = post,
        ws = ws, pend0 = pend, post0 = post, ws0 = ws,
      }
    end
  end
  return out, raises, rates
end

-- One request against an account's rate, a GCRA (generic cell rate algorithm) in the
-- account's field `<id>|rte` (effects) or `|rtr` (reads): `<interval>,<slack>,<tat>`
-- in ms, the interval between requests at the rate, how far ahead of it a burst may
-- run (interval x (burst - 1)), and the theoretical arrival time of the next request
-- (Redis's clock). Returns the field's next text, or nil and how long to wait (ms)
-- when the request comes too early. Reads nothing but `text`, writes nothing.
local function rate_step(text, now)
  local interval, slack, tat = string.match(text or '', '^(%d+),(%d+),(%d+)$')
  interval, slack, tat = tonumber(interval), tonumber(slack), tonumber(tat)
  if not interval or interval == 0 then
    return nil, 0
  end
  local at = math.max(tat, now)
  if at - now > slack then
    return nil, at - now - slack
  end
  return fmt(interval) .. ',' .. fmt(slack) .. ',' .. fmt(at + interval), 0
end

-- The sum of the raises in an account's `raise` field (lua/rule.lua) that are live at
-- `now`: `<rule>|<amount>|<until>` each, comma-separated; 0 for none.
local function live_raise(text, now)
  local total = 0
  if text then
    for amount, expiry in string.gmatch(text, '[^,|]+|(%d+)|(%d+)') do
      if tonumber(expiry) > now then
        total = total + tonumber(amount)
      end
    end
  end
  return total
end

local function load_account(id)
  return load_accounts({id})[1]
end

-- A hold's `acc` split into its accounts (`ids`) and the names of their balance and
-- window fields (`names`: pend, post, win, ws of each), remembered per `acc` (post
-- reads them from every hold). Shared: read only.
local held_accounts = remembering(function(acc)
  local ids, names = split(acc), {}
  for i = 1, #ids do
    local id, at = ids[i], 4 * (i - 1)
    names[at + 1], names[at + 2] = field(id, 'pend'), field(id, 'post')
    names[at + 3], names[at + 4] = field(id, 'win'), field(id, 'ws')
  end
  return {ids = ids, names = names}
end)

-- load_accounts' balance and window only (pend, post, win, ws; nil where missing) of
-- a hold's accounts (held_accounts): what post changes. Every field named costs the
-- HMGET and the script time, and an overrun's count is added with HINCRBY instead of
-- read (save_accounts skips the fields not read).
local function load_balances(held)
  local ids = held.ids
  if #ids == 0 then
    return {} -- a free hold whose accounts were never opened (reserve.lua) holds none
  end
  local v = redis.call('HMGET', ACCOUNTS, unpack(held.names))
  local out = {}
  for i = 1, #ids do
    local at = 4 * (i - 1)
    if v[at + 1] then
      local pend, post, ws = tonumber(v[at + 1]), tonumber(v[at + 2]), tonumber(v[at + 4])
      out[i] = {id = ids[i], pend = pend, post = post, win = tonumber(v[at + 3]), ws = ws,
        pend0 = pend, post0 = post, ws0 = ws}
    end
  end
  return out
end

-- Write back, in one HSET, the balance fields that changed since they were loaded
-- (`pend0`, `post0`, `ws0`, `over0`: what was read), and all fields of an account
-- marked `policy` (new, or its limits changed). The loaded values are kept in the
-- account's own table, not a table of their own: one allocation less per account in
-- every script that changes a balance.
local function save_accounts(list)
  local fields, k = {}, 0
  for i = 1, #list do
    local a = list[i]
    if a then
      local id = a.id
      if a.policy then
        for j = 1, #ACCOUNT_FIELDS do
          local name = ACCOUNT_FIELDS[j]
          fields[k + 1], fields[k + 2], k = field(id, name), fmt(a[name]), k + 2
        end
        a.policy = nil
      else
        -- Written out: the same as a loop over the four names, which measured 2-4%
        -- slower on reserve and post (Redis 7.0, FCALL usec/call).
        if a.pend ~= a.pend0 then
          fields[k + 1], fields[k + 2], k = field(id, 'pend'), fmt(a.pend), k + 2
        end
        if a.post ~= a.post0 then
          fields[k + 1], fields[k + 2], k = field(id, 'post'), fmt(a.post), k + 2
        end
        if a.ws ~= a.ws0 then
          fields[k + 1], fields[k + 2], k = field(id, 'ws'), fmt(a.ws), k + 2
        end
        if a.over ~= a.over0 then
          fields[k + 1], fields[k + 2], k = field(id, 'over'), fmt(a.over), k + 2
        end
      end
      a.pend0, a.post0, a.ws0, a.over0 = a.pend, a.post, a.ws, a.over
    end
  end
  if #fields > 0 then
    redis.call('HSET', ACCOUNTS, unpack(fields))
  end
end

-- "acct|dpending|dposted;..." : the balance change of one journal entry.
local function deltas(accounts, dpend, dpost)
  local out = {}
  for i = 1, #accounts do
    out[i] = accounts[i] .. '|' .. fmt(dpend[i]) .. '|' .. fmt(dpost[i])
  end
  return table.concat(out, ';')
end

local function journal(fields)
  redis.call('XADD', JOURNAL, '*', unpack(fields))
end

-- Renew the account's window once `now` has crossed into a new one: posted amounts
-- of the past window roll off, pending ones carry over. Journaled, so that replay
-- reproduces the balance; the caller saves the account (save_accounts).
local function roll(a, now)
  if a.win <= 0 then
    return
  end
  local ws = now - (now % a.win)
  if ws <= a.ws then
    return
  end
  journal({'op', 'roll', 'd', deltas({a.id}, {0}, {-a.post}), 'ws', fmt(ws)})
  a.post = 0
  a.ws = ws
end

-- The account's posted balance once `now`'s window is rolled in, without writing:
-- for the checks a script makes before its first write.
local function posted_after_roll(a, now)
  if a.win > 0 and now - (now % a.win) > a.ws then
    return 0
  end
  return a.post
end

-- Add to the pending and posted balances of accounts named by id (no window roll):
-- HINCRBY, which reads nothing into Lua.
local function add_balances(accounts, dpend, dpost)
  for i = 1, #accounts do
    if dpend[i] ~= 0 then
      redis.call('HINCRBY', ACCOUNTS, field(accounts[i], 'pend'), fmt(dpend[i]))
    end
    if dpost[i] ~= 0 then
      redis.call('HINCRBY', ACCOUNTS, field(accounts[i], 'post'), fmt(dpost[i]))
    end
  end
end

local function negate(t)
  local out = {}
  for i = 1, #t do
    out[i] = -t[i]
  end
  return out
end

local function zeros(n)
  local out = {}
  for i = 1, n do
    out[i] = 0
  end
  return out
end

local TERMINAL = {posted = true, voided = true, rejected = true, expired = true, denied = true}
-- The states in which a hold is open: its effect is not yet settled (an ambiguous
-- one may have happened at any loss) and it still charges its accounts.
-- An escalated hold is not open: it was never sent and may never be (a human
-- decides), so holds an agent parks in the approval queue would pad the set and lower
-- the price of the ones it keeps; it joins when approved (escalated -> pending).
local OPEN = {pending = true, escalated = false, ambiguous = true, posted = false,
  voided = false, rejected = false, expired = false, denied = false}

-- The bounds of a calibrating route's open set: its face sum stays an exact integer
-- (HINCRBY would fail past 2^63-1, after the script's first write), and its sum of
-- squares within what such faces can square to.
local MAX_POOL_SQUARES = 2 ^ 106

-- Kish's effective number of an open set of `count` holds, face sum `sum` and sum of
-- squares `squares` (the stored fields, as numbers), with one more hold of `face`:
-- (sum v)^2 / sum v^2. The fields are read within what any real set can have (the
-- sum of squares is a float that can lose small squares, and the fields can drift
-- from the live holds: an older irrev's script closing a counted hold), so the number
-- is at least 1 and at most the count with this hold: sum >= 0, and squares >=
-- sum^2 / (count + 1), Cauchy-Schwarz's bound. ledger/records.py's OpenPool.effective
-- computes the same.
local function kish(count, sum, squares, face)
  local k = math.max(count, 0) + 1
  local s1 = math.max(sum, 0) + face
  local s2 = math.max(squares, 0) + face * face
  s2 = math.max(s2, s1 * s1 / k)
  if s2 <= 0 then
    return 1
  end
  return math.min(k, math.max(1, s1 * s1 / s2))
end

-- The ACCOUNTS fields of a calibrating route's open holds (see the key layout).
local function pool_fields(tag)
  return '~' .. tag .. '|n', '~' .. tag .. '|s', '~' .. tag .. '|q'
end

-- A face value's square as HINCRBYFLOAT takes it: the same text for the same face,
-- so the amount a hold takes out of `q` is the one it put in.
local function square_text(face)
  return string.format('%.17g', face * face)
end

-- A calibrating route's hold joins its open set. `cr`: the hold's field
-- `<tag>|<face value>` (reserve.lua). Returns the set's count, face sum and sum of
-- squares (as text) with it.
local function open_pooled(cr)
  local tag, face = string.match(cr, '^([^|]+)|(%d+)$')
  local n, s, q = pool_fields(tag)
  local sum = redis.call('HMGET', ACCOUNTS, s, q)
  local v = tonumber(face)
  if (tonumber(sum[1]) or 0) + v > MAX_AMOUNT or (tonumber(sum[2]) or 0) + v * v > MAX_POOL_SQUARES then
    -- A hold joining again (approved, or found ambiguous) that would take the set
    -- past its bounds: left out rather than failing half way; uncounted, it only
    -- raises the price of the others. The caller drops its `cr`.
    return nil
  end
  return redis.call('HINCRBY', ACCOUNTS, n, 1), redis.call('HINCRBY', ACCOUNTS, s, face),
    redis.call('HINCRBYFLOAT', ACCOUNTS, q, square_text(tonumber(face)))
end

-- A calibrating route's hold leaves its open set. The count is exact (HINCRBY); when
-- it reaches 0 (or, were it ever below, at once) the three fields go, float rounding
-- with them.
local function close_pooled(cr)
  local tag, face = string.match(cr, '^([^|]+)|(%d+)$')
  local n, s, q = pool_fields(tag)
  if redis.call('HINCRBY', ACCOUNTS, n, -1) <= 0 then
    redis.call('HDEL', ACCOUNTS, n, s, q)
  else
    -- fmt, not '-' .. face: HINCRBY refuses '-0' (a free hold's face); HINCRBYFLOAT
    -- takes it
    local v = tonumber(face)
    redis.call('HINCRBY', ACCOUNTS, s, fmt(-v))
    redis.call('HINCRBYFLOAT', ACCOUNTS, q, '-' .. square_text(v))
  end
end

-- Move a hold between states and keep the indexes in step: pending and escalated
-- holds are indexed by deadline; ambiguous and escalated ones have their own sets
-- for the reconciler and the approval queue; settled records get the retention TTL
-- (a TTL never touches a live hold, so it can never release budget). `cr`: the
-- hold's calibrating route (nil for most), whose open set it leaves when it goes
-- from an open state to a closed one, and joins again the other way (an expired
-- hold found ambiguous). A hold that ends other than posted (post.lua keeps `tp`)
-- keeps when, `te` (Redis's clock): how long ago it settled decides whether a repeat
-- of its content still attaches to it (attach.lua).
local function set_state(id, from, to, retention_ms, extra, cr)
  local key = hkey(id)
  if TERMINAL[to] and to ~= 'posted' then
    extra = extra or {}
    extra[#extra + 1], extra[#extra + 2] = 'te', fmt(now_ms())
  end
  if cr and OPEN[from] ~= OPEN[to] then
    if OPEN[from] then
      close_pooled(cr)
    elseif not open_pooled(cr) then
      redis.call('HDEL', key, 'cr')
    end
  end
  if extra and #extra > 0 then
    redis.call('HSET', key, 'st', to, unpack(extra))
  else
    redis.call('HSET', key, 'st', to)
  end
  if (from == 'pending' or from == 'escalated') and to ~= 'pending' then
    redis.call('ZREM', DEADLINES, id)
  end
  if from == 'escalated' then
    redis.call('SREM', ESCALATED, id)
    -- The agent account it was counted on, while it waited (reserve.lua's cap).
    local counted = redis.call('HGET', key, 'esc')
    if counted then
      redis.call('HINCRBY', ACCOUNTS, field(counted, 'esc'), '-1')
    end
  end
  if from == 'ambiguous' then
    redis.call('SREM', AMBIGUOUS, id)
  end
  if to == 'ambiguous' then
    redis.call('SADD', AMBIGUOUS, id)
  end
  if TERMINAL[to] and retention_ms > 0 then
    local ms = fmt(retention_ms)
    redis.call('PEXPIRE', key, ms)
    if to == 'rejected' or to == 'expired' then -- settle_fields set a posted or voided one's
      redis.call('PEXPIRE', pkey(id), ms)
    end
  end
end

-- A due hold: an escalation nobody approved, or a pending hold that was never
-- armed, provably never fired and is released (`expired`). An armed pending hold
-- may have fired, so it becomes `ambiguous` and stays charged until reconciled.
local function expire_one(id, retention_ms)
  local h = redis.call('HMGET', hkey(id), 'st', 'arm', 'acc', 'amt', 'cr')
  local st = h[1]
  if st == 'escalated' or (st == 'pending' and h[2] == '0') then
    local accounts = split(h[3])
    local release = negate(split_numbers(h[4]))
    add_balances(accounts, release, zeros(#accounts))
    set_state(id, st, 'expired', retention_ms, nil, h[5] or nil)
    journal({'op', 'expire', 'hold', id, 'st', 'expired',
             'd', deltas(accounts, release, zeros(#accounts))})
  elseif st == 'pending' then
    set_state(id, st, 'ambiguous', retention_ms, {'amb', 'deadline'})
    journal({'op', 'ambiguous', 'hold', id, 'st', 'ambiguous', 'why', 'deadline'})
  else
    redis.call('ZREM', DEADLINES, id)
  end
end

-- `with_request`: also the request a hold reserved by an older irrev kept in its
-- record (`req`; nil where none), in the same HMGET (approve.lua: a second read of
-- the record cost it a call). `cr`: its calibrating route (set_state), nil for most.
local function load_hold(id, with_request)
  local h
  if with_request then
    h = redis.call('HMGET', hkey(id), 'st', 'arm', 'acc', 'amt', 'pst', 'pws', 'cmp', 'dl', 'by',
      'cr', 'req')
  else
    h = redis.call('HMGET', hkey(id), 'st', 'arm', 'acc', 'amt', 'pst', 'pws', 'cmp', 'dl', 'by',
      'cr')
  end
  if not h[1] then
    return nil
  end
  return {
    id = id, st = h[1], arm = h[2], accounts = split(h[3]), amounts = split_numbers(h[4]),
    posted = h[5] and split_numbers(h[5]), post_ws = h[6] and split_numbers(h[6]),
    -- a posted hold without `cmp` has recovered nothing yet
    compensated = h[7] and split_numbers(h[7]) or zeros(#split(h[3])), deadline = tonumber(h[8]),
    by = h[9], cr = h[10] or nil, req = h[11],
  }
end

-- load_hold's state, accounts, amounts and posted amounts only (what post reads),
-- with the accounts and amounts as stored too (the post's journal entry repeats
-- them), and its held_accounts: each field an HMGET asks for costs Redis time even
-- when it is empty. `accounts` and `held` are shared: read only.
local function load_hold_for_post(id)
  local h = redis.call('HMGET', hkey(id), 'st', 'acc', 'amt', 'pst', 'cr')
  if not h[1] then
    return nil
  end
  local held = held_accounts(h[2])
  return {
    id = id, st = h[1], accounts = held.ids, amounts = split_numbers(h[3]),
    posted = h[4] and split_numbers(h[4]), acc = h[2], amt = h[3], held = held,
    cr = h[5] or nil,
  }
end

-- Per-account amounts for an operation on a settled hold, aligned with the hold's
-- accounts. ARGV[first] is '*' with one amount for every account, or n followed by
-- n pairs (account, amount) naming exactly the hold's accounts. Returns the list,
-- or nil and a bad_input reply.
local function amounts_for(hold, first)
  local out = {}
  if ARGV[first] == '*' then
    local amount = uint(ARGV[first + 1], MAX_AMOUNT)
    if not amount or #ARGV ~= first + 1 then
      return nil, {'bad_input', 'amount', 'must be an integer in [0, 2^53-1]'}
    end
    for i = 1, #hold.accounts do
      out[i] = amount
    end
    return out
  end
  local n = uint(ARGV[first], MAX_ACCOUNTS)
  if not n or n ~= #hold.accounts or #ARGV ~= first + 2 * n then
    return nil, {'bad_input', 'amounts', 'must give one amount for each of the hold\'s accounts'}
  end
  local index = {}
  for i = 1, n do
    index[hold.accounts[i]] = i
  end
  for i = 1, n do
    local at, amount = index[ARGV[first - 1 + 2 * i]], uint(ARGV[first + 2 * i], MAX_AMOUNT)
    if not at or out[at] then
      return nil, {'bad_input', 'amounts', 'must name each of the hold\'s accounts once'}
    end
    if not amount then
      return nil, {'bad_input', 'amount', 'must be an integer in [0, 2^53-1]'}
    end
    out[at] = amount
  end
  return out
end

local function same_numbers(a, b)
  if not a or not b or #a ~= #b then
    return false
  end
  for i = 1, #a do
    if a[i] ~= b[i] then
      return false
    end
  end
  return true
end

-- The accounts of a settled hold that are gone (`accounts[i]` nil: an idle risk-factor
-- account closed after its window, lua/close.lua) opened again, fresh, so that a late
-- post, a compensation or a true-up of the hold still lands on every account it names:
-- each with the limit the hold's reserve saw on it (`lim`, read only when one is
-- missing) and the window of the hold's other accounts (a policy's accounts share
-- one), journaled as a reserve opens one. Call it after the checks, before the writes.
local function reopen_closed(id, ids, accounts, now)
  local win
  for i = 1, #ids do
    if accounts[i] then
      win = accounts[i].win
      break
    end
  end
  local lim
  for i = 1, #ids do
    if not accounts[i] then
      lim = lim or split_numbers(redis.call('HGET', hkey(id), 'lim'))
      local limit, w = lim[i] or 0, win or 0
      local a = {id = ids[i], limit = limit, soft = limit, win = w, appr = 0, pend = 0,
        post = 0, over = 0, ws = w > 0 and now - (now % w) or 0, policy = true}
      journal({'op', 'account', 'acct', a.id, 'limit', fmt(limit), 'soft', fmt(limit),
               'win', fmt(w), 'appr', '0', 'ws', fmt(a.ws)})
      accounts[i] = a
    end
  end
end

-- Releases what a live hold still charges as pending (escalated, pending and
-- ambiguous holds charge their full amounts; expired ones charge nothing).
local function pending_release(hold)
  if hold.st == 'pending' or hold.st == 'escalated' or hold.st == 'ambiguous' then
    return negate(hold.amounts)
  end
  return zeros(#hold.accounts)
end

-- KEYS[6] and KEYS[7] are the keys of hold `id`.
local function hold_keys_ok(id)
  return KEYS[6] == hkey(id) and KEYS[7] == pkey(id)
end

-- ARGV[1], the hold id, and KEYS[6..7] the keys it names.
local function hold_id_arg()
  local id = ARGV[1]
  if not valid_id(id) then
    return nil, {'bad_input', 'hold_id', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
  end
  if not hold_keys_ok(id) then
    return nil, {'bad_input', 'keys', 'KEYS[6..7] must be the keys of hold ' .. id}
  end
  return id
end

-- The upstream's answer, kept with a settled hold so that a repeat of the request
-- gets the same answer without a second effect; the request itself is dropped.
local function outcome_arg()
  local outcome = ARGV[3]
  if type(outcome) ~= 'string' or #outcome > MAX_BLOB then
    return nil, {'bad_input', 'outcome', 'must be at most 1 MiB'}
  end
  return outcome
end

-- An outcome of at most INLINE_OUTCOME bytes is kept in the hold's record, in
-- fields o1, o2, ... of at most OUTCOME_PART bytes: under the 64 bytes that keep a
-- hash packed, and cut between UTF-8 characters (a client reads each field as text).
local INLINE_OUTCOME, OUTCOME_PART = 1024, 63

-- Appends the outcome's parts (o1, o2, ...) to `fields`.
local function outcome_parts(outcome, fields)
  local at, n, size = 1, 0, #outcome
  while at <= size do
    local last = at + OUTCOME_PART - 1
    -- A byte 0x80-0xBF continues the character before it: cut before its start.
    while last < size and last > at and string.byte(outcome, last + 1) >= 0x80
        and string.byte(outcome, last + 1) < 0xC0 do
      last = last - 1
    end
    n = n + 1
    fields[#fields + 1], fields[#fields + 2] = 'o' .. n, string.sub(outcome, at, last)
    at = last + 1
  end
end

local DAY_MS = 86400000

-- The outcome a settlement keeps, within its agent's allowance of kept answer bytes
-- per UTC day (`allowance` from settle_args, false for none): whole while the agent's
-- count (KEYS[8]) plus its length stays within the allowance, and then counted; else
-- the short form the caller gave, its body left out (status, headers, the body's
-- length and digest stay), counted for nothing. The hold is settled either way: the
-- effect was made, and only the bytes a repeat would have shown are given up, so
-- that one agent's answers cannot fill the Redis its tenant's admissions need. A
-- fixed UTC day, counted in the same script as the write, so racing settlements of
-- one agent never keep more than it. An outcome no longer than its short form is
-- kept as it is and not counted: leaving its body out would save nothing. Returns
-- the outcome to keep and whether it is the short form.
local function kept_within(outcome, allowance)
  if not allowance then
    return outcome, false
  end
  local key, size = KEYS[8], #outcome
  if size <= #allowance.short then
    return outcome, false
  end
  local used = redis.call('GET', key)
  if (tonumber(used) or 0) + size > allowance.bytes then
    return allowance.short, true
  end
  if used then
    redis.call('INCRBY', key, size)
  else
    -- The count lives to the end of the UTC day it counts: the next day starts at 0.
    local day_end = (math.floor(now_ms() / DAY_MS) + 1) * DAY_MS
    redis.call('SET', key, size, 'PXAT', fmt(day_end))
  end
  return outcome, false
end

-- A settled (posted or voided) hold keeps neither its request nor a retry's claim
-- (retry.lua: only an ambiguous hold has one), and keeps the outcome, if any, for
-- the record's retention: in the record (outcome_parts) or, when longer than
-- INLINE_OUTCOME, as its payload. `from`: the state it settles from.
local function settle_fields(from, outcome, retention_ms, fields)
  local payload = pkey(ARGV[1])
  if #outcome <= INLINE_OUTCOME then
    redis.call('DEL', payload)
    outcome_parts(outcome, fields)
  elseif retention_ms > 0 then
    redis.call('SET', payload, outcome, 'PX', fmt(retention_ms))
  else
    redis.call('SET', payload, outcome)
  end
  if from == 'ambiguous' then
    redis.call('HDEL', hkey(ARGV[1]), 'rc')
  end
  return fields
end

-- A settled hold's record and payload start their retention again (a later
-- compensation or true-up keeps the record as long as a new settlement would).
local function keep_settled(id, retention_ms)
  if retention_ms > 0 then
    local ms = fmt(retention_ms)
    redis.call('PEXPIRE', hkey(id), ms)
    redis.call('PEXPIRE', pkey(id), ms)
  end
end

local function retention_arg()
  local retention_ms = uint(ARGV[2], MAX_AMOUNT)
  if not retention_ms then
    return nil, {'bad_input', 'retention_ms', 'must be an integer >= 0'}
  end
  return retention_ms
end

-- ARGV[4..6] of the settling scripts: the agent whose allowance of kept answer
-- bytes the outcome counts against ('' for none: then ARGV[5..6] are '' too), the
-- outcome's short form (its body left out) and the allowance in bytes per UTC day;
-- KEYS[8] is that agent's count (kept_within). A table {bytes, short}, false for
-- none, or nil and the error reply.
local function allowance_arg()
  local agent, short, bytes = ARGV[4], ARGV[5], ARGV[6]
  if agent == '' and short == '' and bytes == '' and #KEYS == 7 then
    return false
  end
  if not valid_id(agent) or KEYS[8] ~= P .. 'kept:' .. agent or #KEYS ~= 8 then
    return nil, {'bad_input', 'agent', 'must be an agent id, and KEYS[8] its kept:<agent> key'}
  end
  if type(short) ~= 'string' or short == '' or #short > MAX_BLOB then
    return nil, {'bad_input', 'short', 'must be 1 byte to 1 MiB'}
  end
  bytes = uint(bytes, MAX_AMOUNT)
  if not bytes then
    return nil, {'bad_input', 'allowance', 'must be an integer in [0, 2^53-1]'}
  end
  return {bytes = bytes, short = short}
end

-- ARGV[1..6] of the settling scripts (post, void): hold id, retention, outcome, and
-- the allowance it is kept within (allowance_arg, for kept_within).
local function settle_args()
  local id, err = hold_id_arg()
  if not id then return nil, err end
  local retention_ms
  retention_ms, err = retention_arg()
  if not retention_ms then return nil, err end
  local outcome
  outcome, err = outcome_arg()
  if not outcome then return nil, err end
  local allowance
  allowance, err = allowance_arg()
  if allowance == nil then return nil, err end
  return id, retention_ms, outcome, allowance
end
