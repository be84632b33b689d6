-- archive: take settled holds out of the tenant's slot, once their copies are kept
-- elsewhere (ledger/archive.py), and keep what a replay of their ids needs: an entry
-- of the tenant's settled index. A slot migration moves every key of the slot, and a
-- new hold's keys exist on neither node meanwhile, so the tenant's writes wait for
-- the whole move: settled holds that stayed for their retention made it minutes
-- long. Out of the slot, it holds the live holds, the accounts and a few
-- tenant-wide keys, the index one of them.
--
-- KEYS[1]  the tenant's accounts (bind checks the tenant's keys by it; not touched)
-- KEYS[2]  `...:settled`, the settled index: a hash, hold id -> `<expiry ms>|<digest>`
--          (expiry: Redis time its retention ends, 0 for a hold kept for good;
--          digest: the first 16 hex digits of the SHA-1 of the record as archived,
--          which names its copy: ledger/archive.py's `digest`)
-- KEYS[3]  `...:archive`, the archiver's place: a hash, `journal` -> the id of the
--          last journal entry it read, `trim` -> its HSCAN cursor over the index
-- KEYS[4]  `...:restored`, holds brought back into the slot by restore.lua: a zset,
--          id -> Redis time of the restore (the archiver takes them again later)
-- KEYS[3+2i], KEYS[4+2i]  the record and payload of hold i, for i = 1..n
-- ARGV[1]  the journal entry id read up to ('' leaves it as it is)
-- ARGV[2]  the index's HSCAN cursor to go on from next time ('' leaves it)
-- ARGV[3]  n (0..1000), then per hold: id, digest, expiry_ms, k, and the k field
--          names of its record, in the order of the digest
-- then     m (0..1000), then m pairs: id, the index value seen, for index entries
--          whose retention is over (dropped if unchanged and over by Redis time)
-- then     optionally r (0..1000), then r pairs: id, restore time seen, for ids of the
--          restored set whose record was gone (its retention ended in the slot):
--          dropped from the set if not restored since (a set left to fill with them
--          would hand every pass a page of dead ids, and no restored hold again)
--
-- Returns {archived, changed, trimmed}: holds taken out; holds left because their
-- record is not the one copied (changed since, or not settled); index entries dropped.
--
-- Invariant: a hold leaves the slot only as the record its copy holds (same fields,
-- same values, same payload, checked by digest in this script) and only with its
-- index entry written in the same script, so a reserve of its id finds either the
-- record or the entry (reserve.lua answers 'archived') and never opens it again.
-- A restored hold leaves the restored set when it is archived again.

local function digest_of(rec, pay, names)
  local parts = {}
  local values = redis.call('HMGET', rec, unpack(names))
  for j = 1, #names do
    local v = values[j]
    if not v then return nil end
    parts[#parts + 1] = #names[j] .. ':' .. names[j] .. #v .. ':' .. v
  end
  local payload = redis.call('GET', pay) or ''
  parts[#parts + 1] = #payload .. ':' .. payload
  return string.sub(redis.sha1hex(table.concat(parts)), 1, 16)
end

if KEYS[2] ~= P .. 'settled' or KEYS[3] ~= P .. 'archive' or KEYS[4] ~= P .. 'restored' then
  return {'bad_input', 'keys', 'KEYS[2..4] must be the tenant settled, archive and restored keys'}
end
local n = uint(ARGV[3], 1000)
if not n or #KEYS ~= 4 + 2 * n then
  return {'bad_input', 'holds', 'n must be 0..1000, with a record and payload key each'}
end
local holds, at = {}, 4
for i = 1, n do
  local id, dg, expiry, k = ARGV[at], ARGV[at + 1], uint(ARGV[at + 2], MAX_AMOUNT),
    uint(ARGV[at + 3], 64)
  if not valid_id(id) or KEYS[3 + 2 * i] ~= hkey(id) or KEYS[4 + 2 * i] ~= pkey(id) then
    return {'bad_input', 'holds', 'KEYS[3+2i..4+2i] must be the keys of hold ARGV id i'}
  end
  if type(dg) ~= 'string' or not string.find(dg, '^%x+$') or #dg ~= 16 or not expiry
      or not k or k < 1 then
    return {'bad_input', 'holds', 'each hold: id, 16-digit digest, expiry_ms, 1..64 names'}
  end
  local names = {}
  for j = 1, k do names[j] = ARGV[at + 3 + j] end
  holds[i] = {id = id, dg = dg, expiry = expiry, names = names}
  at = at + 4 + k
end
local m = uint(ARGV[at], 1000)
local rat = at + 2 * (m or 0) + 1
local r, tail = 0, rat - 1
if ARGV[rat] ~= nil then r, tail = uint(ARGV[rat], 1000), rat end
if not m or not r or #ARGV ~= tail + 2 * r then
  return {'bad_input', 'expired', 'm must be 0..1000, then m pairs: id, index value, '
    .. 'then r 0..1000 and r pairs: id, restore time'}
end

local archived, changed, trimmed = 0, 0, 0
for i = 1, n do
  local h = holds[i]
  local rec, pay = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
  local st = redis.call('HGET', rec, 'st')
  if st and TERMINAL[st] and redis.call('HLEN', rec) == #h.names
      and digest_of(rec, pay, h.names) == h.dg then
    redis.call('DEL', rec, pay)
    redis.call('HSET', KEYS[2], h.id, fmt(h.expiry) .. '|' .. h.dg)
    redis.call('ZREM', KEYS[4], h.id)
    archived = archived + 1
  else
    changed = changed + 1
  end
end
local now = now_ms()
for j = 1, m do
  local id, seen = ARGV[at + 2 * j - 1], ARGV[at + 2 * j]
  local expiry = tonumber(string.match(seen or '', '^(%d+)|'))
  if expiry and expiry > 0 and expiry <= now and redis.call('HGET', KEYS[2], id) == seen then
    redis.call('HDEL', KEYS[2], id)
    trimmed = trimmed + 1
  end
end
for j = 1, r do
  local id, seen = ARGV[rat + 2 * j - 1], tonumber(ARGV[rat + 2 * j])
  if seen and tonumber(redis.call('ZSCORE', KEYS[4], id) or '') == seen then
    redis.call('ZREM', KEYS[4], id)
  end
end
if ARGV[1] ~= '' then redis.call('HSET', KEYS[3], 'journal', ARGV[1]) end
if ARGV[2] ~= '' then redis.call('HSET', KEYS[3], 'trim', ARGV[2]) end
return {archived, changed, trimmed}
