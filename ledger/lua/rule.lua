-- rule: set or delete a tenant's bounded-time rule: "approve automatically under X
-- from agent Y" (kept here for the gateway to read), or "raise account A's limit by
-- N" (kept also on the account, where reserve.lua adds it to the limit while it
-- lives). Expiry is Redis's clock: a rule past it is dead wherever it is read,
-- whether or not anything removes it.
--
-- KEYS     accounts, journal (_lib.lua), then KEYS[3] the tenant's rules hash
--          `irrev:{<tenant>}:rules` (fields `<id>`: the rule as JSON, `<id>|until`:
--          its expiry, ms of Redis's clock, `<id>|acct`: the account it raises)
-- ARGV[1]  'set' or 'delete'
-- ARGV[2]  rule id (no '|')
-- ARGV[3]  who (an admin's name)
-- set:     ARGV[4] the rule as JSON (opaque here, at most 4096 bytes)
--          ARGV[5] ttl_ms (> 0): it lives until now + ttl_ms
--          ARGV[6], ARGV[7] optional: an existing account of the tenant and the
--          amount to raise its limit (and soft limit) by while the rule lives:
--          `<account>|raise` holds `<rule id>|<amount>|<until>` per live raise,
--          comma-separated (lua/reserve.lua sums those whose until is after now)
--
-- Returns
--   {'ok', until_ms, now_ms}   set (until_ms) or deleted (0), and journaled
--   {'not_found', '', ''}      delete of a rule that is not there (or expired)
--   {'unknown_account', id}    a raise of an account that does not exist
--   {'bad_input', field, message}   nothing written; field `amount` for a raise that
--                              would take the account's live raises above its limit
--                              or its limit + raises past 2^53-1
--
-- Invariant: at most MAX_RULES live rules per tenant and MAX_RAISES live raises per
-- account; a rule raises at most one account; when a raise is set, the account's live
-- raises sum to at most its limit, and limit + raises to at most 2^53-1; expired ones
-- are removed by the next set. Every change is journaled (op
-- `rule`, with the account and amount of a raise, so replay knows the limit).

local RULES = KEYS[3]
local MAX_RULES = 100
local MAX_RAISES = 8
local action, id, by = ARGV[1], ARGV[2], ARGV[3]
if not valid_id(id) then
  return {'bad_input', 'rule', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
if not valid_id(by) then
  return {'bad_input', 'admin', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
local now = now_ms()

-- The account's raises that are still live, less the one of rule `drop`.
local function live_raises(account, drop)
  local kept = {}
  local text = redis.call('HGET', ACCOUNTS, account .. '|raise') or ''
  for part in string.gmatch(text, '[^,]+') do
    local rule, _, expiry = string.match(part, '^([^|]+)|(%d+)|(%d+)$')
    if rule and rule ~= drop and tonumber(expiry) > now then
      kept[#kept + 1] = part
    end
  end
  return kept
end

local function save_raises(account, kept)
  if #kept == 0 then
    redis.call('HDEL', ACCOUNTS, account .. '|raise')
  else
    redis.call('HSET', ACCOUNTS, account .. '|raise', table.concat(kept, ','))
  end
end

local function forget(rule)
  local account = redis.call('HGET', RULES, rule .. '|acct')
  if account then
    save_raises(account, live_raises(account, rule))
  end
  redis.call('HDEL', RULES, rule, rule .. '|until', rule .. '|acct')
end

if action == 'delete' then
  if #ARGV ~= 3 then return {'bad_input', 'arguments', 'delete takes a rule id and who'} end
  local expiry = tonumber(redis.call('HGET', RULES, id .. '|until'))
  if not expiry then return {'not_found', '', ''} end
  forget(id)
  if expiry <= now then return {'not_found', '', ''} end
  journal({'op', 'rule', 'rule', id, 'act', 'delete', 'by', by})
  return {'ok', 0, now}
end
if action ~= 'set' or (#ARGV ~= 5 and #ARGV ~= 7) then
  return {'bad_input', 'arguments', 'set takes a rule id, who, the rule, a ttl_ms [, account, amount]'}
end
local spec = ARGV[4]
local ttl_ms = uint(ARGV[5], MAX_AMOUNT)
local account, amount = ARGV[6], ARGV[7] and uint(ARGV[7], MAX_AMOUNT)
if #spec == 0 or #spec > 4096 then return {'bad_input', 'rule', 'must be 1-4096 bytes'} end
if not ttl_ms or ttl_ms == 0 then return {'bad_input', 'ttl_ms', 'must be an integer > 0'} end
if account then
  if not valid_id(account) or not string.match(account, '^%a+:.') then
    return {'bad_input', 'account', 'must be kind:name of [A-Za-z0-9._:@/-], at most 128'}
  end
  if not amount then return {'bad_input', 'amount', 'must be an integer in [0, 2^53-1]'} end
  local limit = tonumber(redis.call('HGET', ACCOUNTS, account .. '|limit'))
  if not limit then
    return {'unknown_account', account}
  end
  -- A raise widens a budget: together with the account's other live raises it is at
  -- most the account's own limit (a raise at most doubles it), and limit + raises
  -- stays within 2^53-1, past which doubles round and reserve.lua's sums lose money.
  -- The running total stops at the first excess, so it is compared exactly.
  local total = amount
  for _, part in ipairs(live_raises(account, id)) do
    if total > limit then break end
    total = total + tonumber(string.match(part, '^[^|]+|(%d+)|'))
  end
  if total > limit then
    return {'bad_input', 'amount', 'the live raises of ' .. account .. ' would sum to more '
      .. 'than its limit (' .. fmt(limit) .. '): a raise at most doubles a limit'}
  end
  if total > MAX_AMOUNT - limit then
    return {'bad_input', 'amount', 'would take the limit of ' .. account .. ' past 2^53-1'}
  end
end
-- Checked before any write: only live rules and raises count towards the bounds.
local all = redis.call('HGETALL', RULES)
local live, expired = 0, {}
for i = 1, #all, 2 do
  local rule = string.match(all[i], '^(.+)|until$')
  if rule then
    if tonumber(all[i + 1]) <= now then
      expired[#expired + 1] = rule
    elseif rule ~= id then
      live = live + 1
    end
  end
end
if live >= MAX_RULES then
  return {'bad_input', 'rules', 'at most ' .. MAX_RULES .. ' live rules per tenant'}
end
local kept = account and live_raises(account, id)
if kept and #kept >= MAX_RAISES then
  return {'bad_input', 'raises', 'at most ' .. MAX_RAISES .. ' live raises per account'}
end

for _, rule in ipairs(expired) do
  forget(rule)
end
-- A rule set again replaces itself, raise included, on whichever account it was.
forget(id)
local expiry = now + ttl_ms
local entry = {'op', 'rule', 'rule', id, 'act', 'set', 'by', by, 'until', fmt(expiry)}
if account then
  kept = live_raises(account, id) -- again: forget() may have pruned this account
  kept[#kept + 1] = id .. '|' .. fmt(amount) .. '|' .. fmt(expiry)
  save_raises(account, kept)
  redis.call('HSET', RULES, id .. '|acct', account)
  entry[#entry + 1], entry[#entry + 2] = 'acct', account
  entry[#entry + 1], entry[#entry + 2] = 'raise', fmt(amount)
end
redis.call('HSET', RULES, id, spec, id .. '|until', expiry)
entry[#entry + 1], entry[#entry + 2] = 'spec', spec
journal(entry)
return {'ok', expiry, now}
