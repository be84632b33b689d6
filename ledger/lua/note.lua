-- note: journal, once, who resolved an ambiguous hold by hand and why. The hold was
-- posted or voided by post.lua or void.lua just before (their scripts stay as they
-- are); this entry names the person. Said again after a crash in between, it is
-- written then; said twice, once.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  the state the hold must be in: posted or voided
-- ARGV[3]  who resolved it (an admin's name)
-- ARGV[4]  their note (at most 2048 bytes)
--
-- Returns {status, state, flags}
--   'ok'         journaled now (op `resolve`, the hold's state, by, note)
--   'exists'     this hold's resolution was journaled before (flags: by whom)
--   'conflict'   the hold is in another state (state names it)
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: changes no balance and no hold state; one `resolve` entry per hold.

local id, err = hold_id_arg()
if not id then return err end
local st, by, note = ARGV[2], ARGV[3], ARGV[4]
if st ~= 'posted' and st ~= 'voided' then
  return {'bad_input', 'outcome', 'must be posted or voided'}
end
if not valid_id(by) then
  return {'bad_input', 'admin', 'must be 1-128 characters of [A-Za-z0-9._:@/-]'}
end
if type(note) ~= 'string' or #note > MAX_NOTE or #ARGV ~= 4 then
  return {'bad_input', 'note', 'must be at most 2048 bytes'}
end
local h = redis.call('HMGET', hkey(id), 'st', 'rby')
if not h[1] then return {'not_found', '', ''} end
if h[2] then return {'exists', h[1], h[2]} end
if h[1] ~= st then return {'conflict', h[1], ''} end
redis.call('HSET', hkey(id), 'rby', by, 'rnote', note)
journal({'op', 'resolve', 'hold', id, 'st', st, 'by', by, 'note', note})
return {'ok', st, by}
