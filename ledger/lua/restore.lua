-- restore: bring an archived hold back into the tenant's slot (ledger/archive.py), for
-- an operation that acts on it (a compensation of a posted effect days later, a
-- replay of its id): every hold script then finds it where it always did.
--
-- KEYS[1]  the tenant's accounts (bind checks the tenant's keys by it; not touched)
-- KEYS[2]  `...:settled`, the settled index (archive.lua)
-- KEYS[3]  `...:restored`, the holds restored: a zset, id -> Redis time of the restore
-- KEYS[4], KEYS[5]  the hold's record and payload keys
-- ARGV[1]  hold id
-- ARGV[2]  the digest of the copy read (its index entry names it)
-- ARGV[3]  k (1..64), then k pairs: field name, value (the record as archived, in the
--          order of the digest), then ARGV[4+2k] the payload ('' for none)
--
-- Returns
--   {'restored'}      the record is back, with its retention's end; the index entry gone
--   {'live'}          the record is in the slot already: nothing written
--   {'not_archived'}  the index has no entry for the id, or one naming another copy:
--                     nothing written (read the index again)
--   {'expired'}       the entry's retention is over: the entry is dropped, the id free
--   {'bad_input', field, message}   nothing written
--
-- Invariant: a record comes back only as the copy its index entry names (the digest
-- of what is written is checked here), and the entry leaves in the same script, so an
-- id has its record in the slot or its entry in the index, never both, never neither
-- while its retention lasts.

local id, dg = ARGV[1], ARGV[2]
if not valid_id(id) or KEYS[4] ~= hkey(id) or KEYS[5] ~= pkey(id) then
  return {'bad_input', 'keys', 'KEYS[4..5] must be the keys of hold ARGV[1]'}
end
if KEYS[2] ~= P .. 'settled' or KEYS[3] ~= P .. 'restored' then
  return {'bad_input', 'keys', 'KEYS[2..3] must be the tenant settled and restored keys'}
end
local k = uint(ARGV[3], 64)
if not k or k < 1 or #ARGV ~= 4 + 2 * k then
  return {'bad_input', 'record', 'k must be 1..64, then k pairs and the payload'}
end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'live'} end
local entry = redis.call('HGET', KEYS[2], id)
local expiry, named = string.match(entry or '', '^(%d+)|(%x+)$')
if not expiry or named ~= dg then return {'not_archived'} end
expiry = tonumber(expiry)
if expiry > 0 and expiry <= now_ms() then
  redis.call('HDEL', KEYS[2], id)
  return {'expired'}
end
local parts, fields = {}, {}
for j = 1, k do
  local name, v = ARGV[2 + 2 * j], ARGV[3 + 2 * j]
  parts[j] = #name .. ':' .. name .. #v .. ':' .. v
  fields[2 * j - 1], fields[2 * j] = name, v
end
local payload = ARGV[4 + 2 * k]
parts[k + 1] = #payload .. ':' .. payload
if string.sub(redis.sha1hex(table.concat(parts)), 1, 16) ~= dg then
  return {'bad_input', 'record', 'is not the copy its index entry names'}
end
redis.call('HSET', KEYS[4], unpack(fields))
if payload ~= '' then redis.call('SET', KEYS[5], payload) end
if expiry > 0 then
  redis.call('PEXPIREAT', KEYS[4], fmt(expiry))
  if payload ~= '' then redis.call('PEXPIREAT', KEYS[5], fmt(expiry)) end
end
redis.call('HDEL', KEYS[2], id)
redis.call('ZADD', KEYS[3], fmt(now_ms()), id)
return {'restored'}
