-- keys: create, rotate or revoke one of a tenant's managed keys (agent and admin
-- credentials kept in Redis, not in the policy file: ledger/keystore.py). Only the
-- token's hash is kept; the token itself is shown once, by whoever called this.
--
-- KEYS[1]  the tenant's keys: a hash, key id -> the key's record (JSON: id, tenant,
--          kind, agent, admin, role, owner, purpose, token_sha256, created_ms,
--          expires_ms, rotated_ms, revoked_ms; a time absent is JSON null)
-- KEYS[2]  the tenant's live token hashes: a hash, token_sha256 -> key id
-- KEYS[3]  the tenant's keys version, moved by every key write to a value it never
--          held (what the fleet's watcher compares, to find a write whose epoch bump
--          was lost): the larger of the old one + 1 and Redis's TIME in microseconds,
--          as epoch.lua moves an epoch, since an INCR after a failover that lost a
--          write gives the lost write's value again, and a watcher that read it then
--          sees no change
-- ARGV[1]  the operation: 'create', 'rotate' or 'revoke'
-- ARGV[2]  the key id (key_<12 hex>)
-- create:  ARGV[3] token hash (sha256:<64 hex>), ARGV[4] the record's fixed fields
--          (JSON object: tenant, kind, agent, admin, role, owner, purpose; checked by
--          the caller), ARGV[5] lifetime in ms ('': never expires)
-- rotate:  ARGV[3] the new token hash
-- revoke:  nothing more
--
-- Returns {status, record JSON}: status 'ok' (the record as now stored), 'exists'
-- (create: the id is taken; nothing written), 'hash_taken' (the hash is another
-- key's; nothing written), 'not_found', 'revoked' (rotate of a revoked key; a revoke
-- of one answers 'ok' with the record as it was: revoking is idempotent), 'expired'
-- (rotate of an expired key: create a new one). {'bad_input', field, message} for
-- malformed arguments, before any write.
--
-- Invariant: a revoked key never becomes live again (its hash leaves KEYS[2] and
-- nothing puts it back); a hash maps to at most one key, and KEYS[2] holds exactly
-- the hashes of the keys that are not revoked; the keys version only grows, and a
-- write on a primary that lost another's gives a value that one did not. Times are
-- Redis's (TIME).

redis.replicate_commands() -- Redis 6 needs it to write after TIME; a no-op on 7
local op, id = ARGV[1], ARGV[2]
local function bad(field, message) return {'bad_input', field, message} end
local function is_hash(value)
  return type(value) == 'string' and #value == 71 and value:match('^sha256:[0-9a-f]+$') ~= nil
end
if not id or not id:match('^key_[0-9a-f]+$') or #id ~= 16 then
  return bad('key_id', 'must be key_ and 12 hex digits')
end

local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

local function store(record)
  local text = cjson.encode(record)
  redis.call('HSET', KEYS[1], id, text)
  local now = redis.call('TIME')
  local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local version = math.max((tonumber(redis.call('GET', KEYS[3])) or 0) + 1, now_us)
  redis.call('SET', KEYS[3], string.format('%.0f', version))
  return text
end

local function expired(record, now)
  return record.expires_ms ~= cjson.null and record.expires_ms ~= nil and now >= record.expires_ms
end

if op == 'create' then
  local hash, fixed, life = ARGV[3], ARGV[4], ARGV[5]
  if #ARGV ~= 5 then return bad('argv', 'create takes key id, hash, fields, lifetime') end
  if not is_hash(hash) then return bad('token_sha256', 'must be sha256:<64 hex>') end
  local ok, record = pcall(cjson.decode, fixed)
  if not ok or type(record) ~= 'table' then return bad('fields', 'must be a JSON object') end
  local life_ms = nil
  if life ~= '' then
    life_ms = tonumber(life)
    if not life_ms or life_ms < 1 or life_ms ~= math.floor(life_ms) then
      return bad('expires_in_ms', 'must be a whole number of ms, at least 1')
    end
  end
  if redis.call('HEXISTS', KEYS[1], id) == 1 then return {'exists', redis.call('HGET', KEYS[1], id)} end
  if redis.call('HEXISTS', KEYS[2], hash) == 1 then return {'hash_taken', ''} end
  local now = now_ms()
  record.id = id
  record.token_sha256 = hash
  record.created_ms = now
  record.expires_ms = life_ms and (now + life_ms) or cjson.null
  record.rotated_ms = cjson.null
  record.revoked_ms = cjson.null
  redis.call('HSET', KEYS[2], hash, id)
  return {'ok', store(record)}
end

if op ~= 'rotate' and op ~= 'revoke' then return bad('op', 'must be create, rotate or revoke') end
if op == 'rotate' and (#ARGV ~= 3 or not is_hash(ARGV[3])) then
  return bad('token_sha256', 'must be sha256:<64 hex>')
end
if op == 'revoke' and #ARGV ~= 2 then return bad('argv', 'revoke takes the key id only') end
local text = redis.call('HGET', KEYS[1], id)
if not text then return {'not_found', ''} end
local record = cjson.decode(text)
if record.revoked_ms ~= cjson.null and record.revoked_ms ~= nil then
  return {op == 'revoke' and 'ok' or 'revoked', text}
end
local now = now_ms()
if op == 'revoke' then
  record.revoked_ms = now
  redis.call('HDEL', KEYS[2], record.token_sha256)
  return {'ok', store(record)}
end
if expired(record, now) then return {'expired', text} end
if redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then return {'hash_taken', ''} end
redis.call('HDEL', KEYS[2], record.token_sha256)
redis.call('HSET', KEYS[2], ARGV[3], id)
record.token_sha256 = ARGV[3]
record.rotated_ms = now
return {'ok', store(record)}
