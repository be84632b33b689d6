-- rule: set or delete a tenant's bounded-time rule (e.g. "approve automatically
-- under X from agent Y"). Its expiry is Redis's clock: a rule past it is dead
-- wherever it is read, whether or not anything removes it.
--
-- KEYS     accounts, journal (_lib.lua), then KEYS[3] the tenant's rules hash
--          `irrev:{<tenant>}:rules` (fields `<id>`: the rule as JSON, `<id>|until`:
--          its expiry, ms of Redis's clock)
-- ARGV[1]  'set' or 'delete'
-- ARGV[2]  rule id
-- ARGV[3]  who (an admin's name)
-- set:     ARGV[4] the rule as JSON (opaque here, at most 4096 bytes)
--          ARGV[5] ttl_ms (> 0): it lives until now + ttl_ms
--
-- Returns
--   {'ok', until_ms, now_ms}   set (until_ms) or deleted (0), and journaled
--   {'not_found', '', ''}      delete of a rule that is not there (or expired)
--   {'bad_input', field, message}   nothing written
--
-- Invariant: at most MAX_RULES live rules per tenant; expired ones are removed by
-- the next set. Every change is journaled (op `rule`).

local RULES = KEYS[3]
local MAX_RULES = 100
local action, id, by = ARGV[1], ARGV[2], ARGV[3]
if not valid_id(id) or string.find(id, '|', 1, true) then
  return {'bad_input', 'rule', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
if not valid_id(by) then
  return {'bad_input', 'admin', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
local now = now_ms()
if action == 'delete' then
  if #ARGV ~= 3 then return {'bad_input', 'arguments', 'delete takes a rule id and who'} end
  local expiry = tonumber(redis.call('HGET', RULES, id .. '|until'))
  if not expiry then return {'not_found', '', ''} end
  redis.call('HDEL', RULES, id, id .. '|until')
  if expiry <= now then return {'not_found', '', ''} end
  journal({'op', 'rule', 'rule', id, 'act', 'delete', 'by', by})
  return {'ok', 0, now}
end
if action ~= 'set' or #ARGV ~= 5 then
  return {'bad_input', 'arguments', "set takes a rule id, who, the rule and a ttl_ms"}
end
local spec = ARGV[4]
local ttl_ms = uint(ARGV[5], MAX_AMOUNT)
if #spec == 0 or #spec > 4096 then return {'bad_input', 'rule', 'must be 1-4096 bytes'} end
if not ttl_ms or ttl_ms == 0 then return {'bad_input', 'ttl_ms', 'must be an integer > 0'} end
-- Expired rules go first, so that only live ones count towards the bound.
local all = redis.call('HGETALL', RULES)
local live = 0
for i = 1, #all, 2 do
  local name = all[i]
  local bar = string.find(name, '|', 1, true)
  if bar then
    if tonumber(all[i + 1]) <= now then
      redis.call('HDEL', RULES, name, string.sub(name, 1, bar - 1))
    elseif string.sub(name, 1, bar - 1) ~= id then
      live = live + 1
    end
  end
end
if live >= MAX_RULES then
  return {'bad_input', 'rules', 'at most ' .. MAX_RULES .. ' live rules per tenant'}
end
local expiry = now + ttl_ms
redis.call('HSET', RULES, id, spec, id .. '|until', expiry)
journal({'op', 'rule', 'rule', id, 'act', 'set', 'by', by, 'until', fmt(expiry), 'spec', spec})
return {'ok', expiry, now}
