-- reserve: decide one effect and, unless denied, hold its price on every account
-- it touches.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua),
--          then KEYS[8] `...:settled`, the tenant's settled index (archive.lua)
-- ARGV[1]  hold id (the caller's idempotency key)
-- ARGV[2]  fingerprint of the request (a replay must carry the same one)
-- ARGV[3]  ttl_ms: a pending hold's life
-- ARGV[4]  escalation_ttl_ms: an escalated hold's life while it waits for a human
-- ARGV[5]  armed: 1 if the caller fires the effect as soon as it is admitted
-- ARGV[6]  retention_ms for the settled record (0 keeps it)
-- ARGV[7]  escalate_above: a price above this escalates (0: no route threshold)
-- ARGV[8]  request: opaque bytes kept with a held effect until it settles (in
--          KEYS[7]), so that an approver or the reconciler can act on it ('' for none)
-- ARGV[9]  provenance: who asked for the effect and what it was, kept verbatim in
--          the journal entry (`prov`, see ledger/journal.py; '' for none)
-- ARGV[10] n, the number of accounts (1..8), then n pairs: account id, amount
-- ARGV[11+2n]  denied_retention_ms: a denied record's life (0 keeps it); it only
--          serves a replay of the refusal, so it is kept short
-- ARGV[12+2n]  m, accounts to open if missing (0..n), then m groups of five: account
--          id (one of the hold's), limit, soft limit, window_ms, approval threshold
--          (as in account.lua). A missing account is opened only when the hold is
--          admitted or escalated and its amount is > 0; one whose amount is 0 is left
--          out of the hold (a fresh account with nothing on it cannot change the
--          decision), so neither a refusal nor a free effect creates an account.
-- ARGV[13+2n+5m]  count escalations: '1' counts a kept escalation on its first agent
--          account (`esc`, capped by the account's `escmax`); '0' neither counts nor
--          caps it, while the fleet's release flag says a host of an older release,
--          whose scripts never uncount one, may resolve it (ledger/release.py's
--          COUNTED_ESCALATIONS)
-- ARGV[14+2n+5m]  shadow: '1' holds the effect even when the decision is deny or
--          escalate (shadow mode: never blocking; the would-be decision is kept in
--          the hold's reason and the journal, and the hold may take accounts above
--          their limits); '0' enforces; '2' enforces on an escrow shard, where a
--          refusal for want of room (budget_exceeded, over_limit, soft_band) is
--          answered `short` instead, nothing written
-- ARGV[15+2n+5m]  optional: '1' decides even if holds of the tenant are due; '2' looks
--          for due holds before any decision (a batch's items, so that one admitted
--          cannot take the room an earlier item of the batch waits for: see
--          `expire_first`); '0' (or none) only where they can change the answer
-- ARGV[16+2n+5m..18+2n+5m]  optional, after ARGV[15+2n+5m], for a hold of a
--          calibrating route (pricing/calibration.py): the route's tag (1-32 letters
--          and digits), the effect's face value, and the number of holds pending at
--          once its price was computed for, m >= 1 (a decimal). The hold is counted
--          in the route's open set (_lib.lua's key layout) while it is open. Its price
--          falls as m rises, so it must not be kept at a price made for more holds
--          than are open: unless the open set with this hold counts at least m
--          (Kish's effective number, (sum v)^2 / sum v^2 of their face values v, at
--          least 1, at most the count with this hold: _lib.lua's kish), nothing is
--          written and the reply is `reprice`; one whose face would take the set's
--          face sum past 2^53-1 (or its squares past 2^106) is sent back (`reprice`)
--          when priced for m > 1 and kept outside the set when priced alone (m = 1),
--          so that one huge hold can neither overflow the set nor close the route
-- ARGV[19+2n+5m]  the price the effect would have alone (priced for m = 1), which
--          the approval thresholds compare instead of a pooled amount below it (an
--          agent can open holds itself to pool over): required when m > 1 (else
--          `bad_input` alone_price), optional when m = 1
--
-- Returns
--   {'ok' | 'exists', decision, reason, state, deadline_ms, created_ms, n,
--    account_1, limit_1, used_1, amount_1, ...}
--       decision admit | deny | escalate; reason within_budget | budget_exceeded |
--       over_limit | soft_band | approval_threshold | escalation_cap (a would-be
--       escalation past its agent's max escalations waiting); used_i is pending + posted
--       before this hold. 'exists' is a replay: the original decision and numbers,
--       the hold's current state, and nothing changed (its fingerprint is re-set to
--       its own value, so that the caller's WAIT or WAITAOF, which count the writes
--       of their own connection since Redis 7.2, covers the reserve it replays: one
--       on a connection that wrote nothing was acknowledged by a replica that never
--       received the hold; the re-set is propagated after it). A calibrating reserve's
--       'ok' reply ends with the route's open set after it: count, face sum, sum of
--       squares (text), three more elements.
--   {'reprice', count, face sum, sum of squares}   nothing written: the route's open
--       set is smaller than the price assumed; price it for this set and call again
--   {'reprice', count, face sum, sum of squares, 'alone'}   nothing written: priced
--       for more than one hold, the effect would escalate (outside the set until a
--       human approves it, when the set may be smaller): price it alone and call again
--   {'exists_with_different_fingerprint', state}   nothing written
--   {'archived', ''}   nothing written: the id's hold is settled and archived out of
--       the slot (its index entry lives while its retention does); restore it
--       (restore.lua) and call again, which replays it
--   {'unknown_account', account_id}                 nothing written
--   {'escrowed'}   nothing written: an account to open, on a tenant split over
--       escrow shards or on one of them (_lib.lua's escrowed)
--       In shadow mode a deny or escalate comes with state 'pending': held anyway.
--   {'expire_first', ''}   holds of the tenant are due, whose release the decision
--       should see, but their keys are not declared here: nothing written; expire
--       them (sweep.lua) and call again with ARGV[14+2n+5m] = '1'. Asked only before
--       an answer other than an admission, and for every reserve of a calibrating
--       route: a release only makes room, so it cannot turn an admission around. In a
--       batch it can reorder one: an item admitted at once would take the room that
--       an earlier item, sent back to expire first, is decided on after it; so a
--       batch's items ask before any decision ('2'), and all of them from the first
--       due hold on come back, to be decided again in order
--   {'short', reason, n, account_1, lacks_1, ...}   nothing written (ARGV[14+2n+5m] =
--       '2'): the refusal it would be, and what each account lacks for this hold (0
--       where it has room): against its limit, or its soft limit for a soft_band
--   {'rate_limited', account_id, wait_ms}           nothing written: too early for the
--       account's effect rate (`<id>|rte`, account.lua); ask again in wait_ms
--   {'bad_input', field, message}                   nothing written (also a hold
--       that would take an account's pending + posted past 2^53-1: only a shadow
--       one can, since a limit plus its raises counts as at most 2^53-1)
--
-- The hold record: st, fp, arm, t0, dl, acc and amt (comma lists: the accounts and
-- what it holds on each), why, lim and used (what decided, for a replay; the
-- decision follows from the reason), cr (`<tag>|<face value>`, only a kept hold of a
-- calibrating route: what leaves its open set when it closes, _lib.lua's set_state),
-- esc (an escalated hold: the agent account whose count of waiting escalations it is
-- in, `<account>|esc` in the accounts hash, until it leaves the escalated state); the request is KEYS[7]'s. Each value stays short
-- (Redis keeps a hash whose values are all under 64 bytes packed, in a third of the
-- memory), so the limits and used amounts are not joined into one. Its journal
-- entry: op, hold, why (absent for within_budget), acc and amt for a hold kept (the pending it adds; one
-- number when it is every account's, journal_numbers), shadow
-- (the would-be decision of a hold kept in shadow mode: its state is pending whatever
-- the reason), prov. A shadow hold's record is pending with the would-be reason.
--
-- Invariant: an agent account's `esc` counts exactly the escalated holds that name it
-- in their `esc`, and a new escalation counted is kept only while that count is
-- below its `escmax`. An admission or escalation never takes any account's pending + posted
-- above its limit (a shadow hold may: it is what the fleet really did), no hold takes
-- it past 2^53-1 (a limit with its live raises counts as min(sum, 2^53-1)), and it
-- debits all of the accounts or none. A calibrating route's open count is the number
-- of its holds in an open state (pending, ambiguous): a kept pending hold joins
-- in the same script, a replay and a refusal never do. Inputs are checked before the
-- first write (Redis does not roll back a script that fails half way).

local id, fp = ARGV[1], ARGV[2]
if not valid_id(id) then
  return {'bad_input', 'idempotency_key', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
if not hold_keys_ok(id) or KEYS[8] ~= P .. 'settled' then
  return {'bad_input', 'keys', 'KEYS[6..8] must be the keys of hold ' .. id
    .. ' and the tenant settled index'}
end
if not valid_id(fp) then
  return {'bad_input', 'fingerprint', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
local ttl_ms = uint(ARGV[3], MAX_AMOUNT)
local esc_ttl_ms = uint(ARGV[4], MAX_AMOUNT)
local armed = ARGV[5]
local retention_ms = uint(ARGV[6], MAX_AMOUNT)
local escalate_above = uint(ARGV[7], MAX_AMOUNT)
local request = ARGV[8]
local provenance = ARGV[9]
local n = uint(ARGV[10], MAX_ACCOUNTS)
if not ttl_ms then return {'bad_input', 'ttl_ms', 'must be an integer >= 0'} end
if not esc_ttl_ms then return {'bad_input', 'escalation_ttl_ms', 'must be an integer >= 0'} end
if armed ~= '0' and armed ~= '1' then return {'bad_input', 'armed', 'must be 0 or 1'} end
if not retention_ms then return {'bad_input', 'retention_ms', 'must be an integer >= 0'} end
if not escalate_above then
  return {'bad_input', 'escalate_above', 'must be an integer in [0, 2^53-1]'}
end
if #request > MAX_BLOB then
  return {'bad_input', 'request', 'must be at most 1 MiB'}
end
if type(provenance) ~= 'string' or #provenance > MAX_PROVENANCE then
  return {'bad_input', 'provenance', 'must be at most ' .. MAX_PROVENANCE .. ' bytes'}
end
if not n or n < 1 or #ARGV < 12 + 2 * n then
  return {'bad_input', 'accounts', 'must name 1 to ' .. MAX_ACCOUNTS .. ' accounts, each with an amount'}
end
local accounts, amounts, seen = {}, {}, {}
for i = 1, n do
  local account, amount = ARGV[9 + 2 * i], uint(ARGV[10 + 2 * i], MAX_AMOUNT)
  if not valid_id(account) or seen[account] then
    return {'bad_input', 'accounts', 'account ids must be distinct and well formed'}
  end
  if not amount then
    return {'bad_input', 'amount', 'must be an integer in [0, 2^53-1]'}
  end
  seen[account] = i
  accounts[i], amounts[i] = account, amount
end
local denied_retention_ms = uint(ARGV[11 + 2 * n], MAX_AMOUNT)
if not denied_retention_ms then
  return {'bad_input', 'denied_retention_ms', 'must be an integer >= 0'}
end
local m = uint(ARGV[12 + 2 * n], MAX_ACCOUNTS)
local base = 14 + 2 * n + 5 * (m or 0)
local counting, shadow, decide = ARGV[base - 1], ARGV[base], ARGV[base + 1]
if not m or m > n or (#ARGV ~= base and #ARGV ~= base + 1 and #ARGV ~= base + 4 and #ARGV ~= base + 5)
    or (decide and decide ~= '0' and decide ~= '1' and decide ~= '2') then
  return {'bad_input', 'open', 'must give 0 to n accounts to open, five fields each'}
end
if counting ~= '0' and counting ~= '1' then
  return {'bad_input', 'count_escalations', 'must be 0 or 1'}
end
if shadow ~= '0' and shadow ~= '1' and shadow ~= '2' then
  return {'bad_input', 'shadow', 'must be 0, 1 or 2'}
end
local decide_anyway, in_order = decide == '1', decide == '2'
local tag, face = ARGV[base + 2], uint(ARGV[base + 3], MAX_AMOUNT)
-- A decimal only: Lua's tonumber also reads 'nan', 'inf' and '0x10'.
local priced_for = ARGV[base + 4]
priced_for = type(priced_for) == 'string' and #priced_for <= 32
  and (string.find(priced_for, '^%d+%.?%d*$') or string.find(priced_for, '^%d+%.?%d*e[+-]?%d+$'))
  and tonumber(priced_for) or nil
local alone = ARGV[base + 5] and uint(ARGV[base + 5], MAX_AMOUNT)
if ARGV[base + 5] and not alone then
  return {'bad_input', 'alone_price', 'must be an integer in [0, 2^53-1]'}
end
if tag then
  if #tag > 32 or not string.find(tag, '^%w+$') then
    return {'bad_input', 'route_tag', 'must be 1-32 letters and digits'}
  end
  if not face then
    return {'bad_input', 'face_value', 'must be an integer in [0, 2^53-1]'}
  end
  if not priced_for or priced_for ~= priced_for or priced_for < 1 or priced_for >= math.huge then
    return {'bad_input', 'pending', 'must be a decimal number >= 1'}
  end
  -- Without it the thresholds would compare the pooled price, which the holds an
  -- agent opens itself lower (an older caller's reserve): refused, not guessed.
  if priced_for > 1 and not alone then
    return {'bad_input', 'alone_price', 'a reserve priced for more than one open hold '
      .. '(pending > 1) must give its price alone, which the approval thresholds compare'}
  end
end
local specs = {}
for j = 1, m do
  local at = 12 + 2 * n + 5 * (j - 1)
  local i = seen[ARGV[at + 1]]
  local limit, soft = uint(ARGV[at + 2], MAX_AMOUNT), uint(ARGV[at + 3], MAX_AMOUNT)
  local win, appr = uint(ARGV[at + 4], MAX_AMOUNT), uint(ARGV[at + 5], MAX_AMOUNT)
  if not i or specs[i] or not string.match(ARGV[at + 1], '^%a+:.') then
    return {'bad_input', 'open', 'must name distinct kind:name accounts of the hold'}
  end
  if not limit or not soft or soft > limit or not win or not appr then
    return {'bad_input', 'open', 'limit, soft limit <= limit, window and threshold: integers'}
  end
  specs[i] = {limit = limit, soft = soft, win = win, appr = appr}
end

local key = hkey(id)
-- One field first: a new hold (the common case) pays for an HGET, not an HMGET of ten.
local held = redis.call('HGET', key, 'fp')
if held then
  held = redis.call('HMGET', key, 'fp', 'why', 'st', 'dl', 't0', 'acc', 'lim', 'used', 'amt')
  if held[1] ~= fp then
    return {'exists_with_different_fingerprint', held[3]}
  end
  redis.call('HSET', key, 'fp', fp)
  local reply = {'exists', DECISION[held[2]], held[2], held[3], tonumber(held[4]),
    tonumber(held[5])}
  local acc, lim, used, amt = split(held[6]), split_numbers(held[7]), split_numbers(held[8]),
    split_numbers(held[9])
  reply[7] = #acc
  for i = 1, #acc do
    reply[#reply + 1] = acc[i]
    reply[#reply + 1] = lim[i]
    reply[#reply + 1] = used[i]
    reply[#reply + 1] = amt[i]
  end
  return reply
end
if archived_id(KEYS[8], id) then
  return {'archived', ''}
end

local asked = table.concat(accounts, ',')
local loaded, raises, rates = load_for_reserve(accounts, asked)
for i = 1, n do
  if not loaded[i] and not specs[i] then
    return {'unknown_account', accounts[i]}
  end
end

local now = now_ms()
-- The effect rates of the hold's accounts (an agent's, a principal's: account.lua):
-- a request too early for any of them is refused as it is, nothing written, with how
-- long to wait; one in time moves each rated account's next arrival (written with the
-- hold, whatever the decision: a refused request is a request too).
local paced = {}
for i = 1, n do
  if rates[i] then
    local next_rate, wait_ms = rate_step(rates[i], now)
    if wait_ms > 0 then
      return {'rate_limited', accounts[i], fmt(wait_ms)}
    end
    if next_rate then
      paced[#paced + 1], paced[#paced + 2] = field(accounts[i], 'rte'), next_rate
    end
  end
end
-- Holds of the tenant that are due change the answer only by what their release
-- frees (or their leaving a calibrating route's open set): an admission stands
-- whatever is due, so the common reserve (admitted, no calibrating route) does
-- without the look at the deadlines (one Redis call less).
if tag and not decide_anyway and holds_due(now) then
  return {'expire_first', ''}
end

-- A calibrating route's open set as it is now; with this hold, it must count at
-- least what the price assumed.
local pool
local outside = false
if tag then
  local nf, sf, qf = pool_fields(tag)
  pool = redis.call('HMGET', ACCOUNTS, nf, sf, qf)
  for i = 1, 3 do
    pool[i] = pool[i] or '0'
  end
  local count, sum, squares = tonumber(pool[1]), tonumber(pool[2]), tonumber(pool[3])
  -- Checked here, not by HINCRBY after the writes: a set past its bounds would fail
  -- the script half way (a hold charged with no journal entry). Such a hold is
  -- priced alone, then kept out of the set (as approve.lua does), rather than
  -- refused: a refusal would close the route to every agent while it is open.
  if sum + face > MAX_AMOUNT or squares + face * face > MAX_POOL_SQUARES then
    if priced_for > 1 then
      return {'reprice', pool[1], pool[2], pool[3]}
    end
    outside = true
  elseif priced_for > 1 and kish(count, sum, squares, face) < priced_for then
    return {'reprice', pool[1], pool[2], pool[3]}
  end
end

-- Inputs are good: from here on the script writes.
-- A missing account to open stands in as a fresh one (zero balances, this window),
-- written only if the hold is kept; one with nothing to hold is left out.
local opening, kept = {}, 0
for i = 1, n do
  local a = loaded[i]
  if not a and amounts[i] > 0 then
    local spec = specs[i]
    if next(opening) == nil and escrowed() then
      return {'escrowed'}
    end
    a = {id = accounts[i], limit = spec.limit, soft = spec.soft, win = spec.win,
         appr = spec.appr, pend = 0, post = 0, over = 0,
         ws = spec.win > 0 and now - (now % spec.win) or 0, policy = true}
    opening[a.id] = a
  end
  if a then
    kept = kept + 1
    loaded[kept], accounts[kept], amounts[kept], raises[kept] = a, accounts[i], amounts[i], raises[i]
  end
end
for i = n, kept + 1, -1 do
  loaded[i], accounts[i], amounts[i], raises[i] = nil, nil, nil, nil
end
local all_kept = kept == n
n = kept

-- A temporary raise (lua/rule.lua) adds to an account's limit and soft limit while
-- it lives, by Redis's clock: it ends by itself, with nothing to undo. The live
-- raises count for at most the limit in force (rule.lua bounds them so when they
-- are set; a policy that cuts the limit later, an operator stopping a spender, cuts
-- what they add too), and the sum as at most 2^53-1 (a policy may raise the limit
-- under older raises): past it doubles round, and an admission must stay exact.
local decision, reason = 'admit', 'within_budget'
local limits, used, soft = {}, {}, {}
for i = 1, n do
  local a = loaded[i]
  local extra = math.min(live_raise(raises[i], now), a.limit)
  limits[i], used[i] = math.min(a.limit + extra, MAX_AMOUNT), a.pend + posted_after_roll(a, now)
  soft[i] = math.min(a.soft + extra, MAX_AMOUNT)
end
for i = 1, n do
  if used[i] > limits[i] then
    decision, reason = 'deny', 'over_limit'
    break
  elseif used[i] + amounts[i] > limits[i] then
    decision, reason = 'deny', 'budget_exceeded'
    break
  end
end
if decision == 'admit' then
  for i = 1, n do
    if used[i] + amounts[i] > soft[i] then
      decision, reason = 'escalate', 'soft_band'
      break
    end
    -- A threshold compares the price the effect would have alone: a pooled price
    -- falls with the holds open, which an agent can open itself.
    local asked_i = alone and math.max(amounts[i], alone) or amounts[i]
    local appr = loaded[i].appr
    if (appr > 0 and asked_i > appr) or (escalate_above > 0 and asked_i > escalate_above) then
      decision, reason = 'escalate', 'approval_threshold'
      break
    end
  end
end

-- An agent keeps at most its account's max escalations waiting (account.lua's
-- `escmax`): one more is denied and holds nothing, so that no agent can bury the
-- approval queue (and the webhook) in escalations however small. Counted on the
-- first agent account of the hold (`counted`), which its record names (`esc`) until
-- it leaves the escalated state (_lib.lua's set_state).
local counted
if decision == 'escalate' and shadow ~= '1' and counting == '1' then
  for i = 1, n do
    if string.sub(accounts[i], 1, 6) == 'agent:' then
      local c = redis.call('HMGET', ACCOUNTS, field(accounts[i], 'esc'), field(accounts[i], 'escmax'))
      local cap = tonumber(c[2])
      if cap and cap > 0 and (tonumber(c[1]) or 0) >= cap then
        decision, reason = 'deny', 'escalation_cap'
      else
        counted = accounts[i]
      end
      break
    end
  end
end

-- An agent opens at most its account's max new accounts (`nfamax`, account.lua) of
-- risk-factor accounts per window: a kept hold that would open more is denied
-- (`account_cap`) and opens none, so that one agent cannot fill the tenant's hash with
-- an account per payee faster than the policy allows (lua/close.lua removes them once
-- idle). Counted on the agent's account as `nfa` = `<window start>|<opened>`; a
-- shadow hold counts on its real agent account's bound and count.
local opened, capped = 0, nil
if decision == 'admit' or decision == 'escalate' or shadow == '1' then
  for id in pairs(opening) do
    if string.find(id, '^factor:') or string.find(id, '^shadow:factor:') then
      opened = opened + 1
    end
  end
end
if opened > 0 then
  for i = 1, n do
    local agent = string.match(accounts[i], '^shadow:(agent:.+)$') or accounts[i]
    if string.sub(agent, 1, 6) == 'agent:' then
      local c = redis.call('HMGET', ACCOUNTS, field(agent, 'nfa'), field(agent, 'nfamax'))
      local cap, win = tonumber(c[2]), loaded[i].win
      local ws = win > 0 and now - (now % win) or 0
      local at, count = string.match(c[1] or '', '^(%d+)|(%d+)$')
      count = tonumber(at) == ws and tonumber(count) or 0
      if cap and cap > 0 and count + opened > cap then
        -- A bound on what the tenant's hash holds, not a budget decision: shadow mode
        -- refuses it too (below).
        decision, reason = 'deny', 'account_cap'
      else
        capped = {agent, fmt(ws) .. '|' .. fmt(count + opened)}
      end
      break
    end
  end
end

if not tag and (decision ~= 'admit' or in_order) and not decide_anyway and holds_due(now) then
  return {'expire_first', ''}
end

-- An escalated hold waits outside its route's open set (_lib.lua's OPEN) and joins
-- whatever set is open when a human approves it, which may be smaller than any it
-- could be priced for now: priced for a pool, it is sent back to be priced alone,
-- the price every set covers, so that approval changes no balance and never joins
-- a hold below its price (approve.lua). In shadow mode it is held, and joins, now.
if tag and priced_for > 1 and decision == 'escalate' and shadow ~= '1' then
  return {'reprice', pool[1], pool[2], pool[3], 'alone'}
end

-- An escrow shard holds a slice of each limit (ledger/escrow.py): a refusal for want
-- of room may be room the parent or another shard still has. Nothing is written;
-- the caller leases what each account lacks and asks again.
if shadow == '2' and (reason == 'budget_exceeded' or reason == 'over_limit'
    or reason == 'soft_band') then
  local reply = {'short', reason, n}
  for i = 1, n do
    local top = reason == 'soft_band' and soft[i] or limits[i]
    reply[#reply + 1] = accounts[i]
    reply[#reply + 1] = fmt(math.max(used[i] + amounts[i] - top, 0))
  end
  return reply
end

-- Checked before any write, like post.lua's: a hold kept (only a shadow one can be
-- above a limit, and every limit is at most 2^53-1) never takes pending + posted past
-- 2^53-1, where the ledger's arithmetic stops being exact.
if decision == 'admit' or decision == 'escalate' or shadow == '1' then
  for i = 1, n do
    if used[i] + amounts[i] > MAX_AMOUNT then
      return {'bad_input', 'amount', 'would take ' .. accounts[i] .. ' past 2^53-1'}
    end
  end
end

-- Inputs and decision are final: the windows roll (journaled) only now, so that a
-- reply above writes nothing.
for i = 1, n do
  roll(loaded[i], now)
end

local state, deadline = 'denied', 0
if decision == 'admit' or (shadow == '1' and reason ~= 'account_cap') then
  state, deadline = 'pending', now + ttl_ms
elseif decision == 'escalate' then
  state, deadline = 'escalated', now + esc_ttl_ms
end

if state ~= 'denied' and capped then
  redis.call('HSET', ACCOUNTS, field(capped[1], 'nfa'), capped[2])
end
if state ~= 'denied' then
  for i = 1, n do
    local a = opening[accounts[i]]
    if a then
      journal({'op', 'account', 'acct', a.id, 'limit', fmt(a.limit), 'soft', fmt(a.soft),
               'win', fmt(a.win), 'appr', fmt(a.appr), 'ws', fmt(a.ws)})
    end
  end
end

local acc = all_kept and asked or table.concat(accounts, ',')
local amt = join_numbers(amounts)
local fields = {'st', state, 'fp', fp, 'arm', (state == 'escalated') and '0' or armed,
  't0', fmt(now), 'dl', fmt(deadline), 'acc', acc, 'amt', amt, 'why', reason,
  'lim', join_numbers(limits), 'used', join_numbers(used)}
local cr = tag and state ~= 'denied' and not outside and tag .. '|' .. fmt(face)
if cr then
  fields[#fields + 1], fields[#fields + 2] = 'cr', cr
end
if state == 'escalated' and counted then
  fields[#fields + 1], fields[#fields + 2] = 'esc', counted
  redis.call('HINCRBY', ACCOUNTS, field(counted, 'esc'), '1')
end
redis.call('HSET', key, unpack(fields))
if #paced > 0 then
  redis.call('HSET', ACCOUNTS, unpack(paced))
end
if state ~= 'denied' and #request > 0 then
  redis.call('SET', KEYS[7], request)
else
  -- A payload left under this id (its record gone first, or written by an older
  -- irrev) is not this hold's request: an approver would forward it.
  redis.call('DEL', KEYS[7])
end
-- A refusal changes no balance, so its journal entry names none (not even the
-- accounts it would have opened).
-- An admission within budget (the common case) journals no reason: it is the one
-- JournalEntry reads when there is none.
local entry = {'op', 'reserve', 'hold', id}
if reason ~= 'within_budget' then
  entry[5], entry[6] = 'why', reason
end
if state == 'denied' then
  if denied_retention_ms > 0 then
    redis.call('PEXPIRE', key, fmt(denied_retention_ms))
  end
  -- Only the windows it rolled are saved: the accounts it would open are not.
  local rolled = {}
  for i = 1, n do
    if not opening[accounts[i]] then
      rolled[#rolled + 1] = loaded[i]
    end
  end
  save_accounts(rolled)
else
  entry[#entry + 1], entry[#entry + 2] = 'acc', acc
  entry[#entry + 1], entry[#entry + 2] = 'amt', journal_numbers(amounts, amt)
  for i = 1, n do
    local a = loaded[i]
    a.pend = a.pend + amounts[i]
  end
  save_accounts(loaded)
  redis.call('ZADD', DEADLINES, fmt(deadline), id)
  if state == 'escalated' then
    redis.call('SADD', ESCALATED, id)
  end
  if cr and state == 'pending' then
    -- An escalated hold joins when approved (_lib.lua's OPEN).
    pool = {open_pooled(cr)}
  end
end
if state == 'pending' and decision ~= 'admit' then
  -- Held in shadow mode: what enforcement would have done.
  entry[#entry + 1], entry[#entry + 2] = 'shadow', decision
end
if #provenance > 0 then
  entry[#entry + 1], entry[#entry + 2] = 'prov', provenance
end
journal(entry)

local reply = {'ok', decision, reason, state, deadline, now, n}
for i = 1, n do
  reply[#reply + 1] = accounts[i]
  reply[#reply + 1] = limits[i]
  reply[#reply + 1] = used[i]
  reply[#reply + 1] = amounts[i]
end
if pool then
  reply[#reply + 1], reply[#reply + 2], reply[#reply + 3] = pool[1], pool[2], pool[3]
end
return reply
