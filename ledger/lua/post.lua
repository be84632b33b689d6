-- post: record that a held effect happened and what it really cost.
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload, and
--          with an allowance the agent's kept answer bytes (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  retention_ms for the settled record (0 keeps it)
-- ARGV[3]  outcome: the upstream's answer to keep for repeats ('' for none)
-- ARGV[4..6] agent, short outcome, allowance: the outcome is kept within the agent's
--          allowance of kept answer bytes per UTC day, else as the short one (its
--          body left out), with KEYS[8] the agent's count ('', '', '' and no KEYS[8]:
--          kept whole; settle_args, kept_within in _lib.lua)
-- ARGV[7]  '*' then ARGV[8] the posted amount for every account, or
--          n then n pairs (account id, posted amount) naming the hold's accounts
--
-- Returns {status, state, flags}
--   'ok'                              posted now; flags lists `overrun` (an amount
--                                      above the hold: the world did it, so it is
--                                      posted, never refused), `late` (the hold
--                                      had expired and was released) and
--                                      `body_omitted` (the short outcome was kept:
--                                      the agent's allowance was used up)
--   'exists'                          already posted with these amounts: the
--                                      hold's st is set again to 'posted' (see below)
--   'exists_with_different_amount'    already posted with other amounts
--   'conflict'                        the hold is escalated, voided, rejected or denied
--   'not_found', 'bad_input' (state = field, flags = message; also an amount
--                                      that would take an account's pending +
--                                      posted past 2^53-1, checked before any write)
--
-- The hold gains pst (the posted amounts), pws (each account's window at the post),
-- tp, flag if any (cmp, what was recovered, appears with a compensation), and the
-- outcome: in the record (o1, o2, ...) or, when long, as its payload (KEYS[7]);
-- the request is dropped (settle_fields in _lib.lua).
-- Its journal entry: op, hold, acc, rel (the pending released, per account: the
-- hold's amounts, absent when it had expired), pst, flag if any; rel and pst are
-- one number when it is every account's (journal_numbers).
--
-- Invariant: pending falls by exactly what the hold still charged, posted rises by
-- exactly the posted amounts, and the journal entry carries both. The agent's count
-- of kept answer bytes never passes its allowance; the hold is posted either way. A replay ('exists')
-- writes nothing but re-sets one field to its own value, so that its caller's WAIT
-- covers the settlement it replays: WAIT / WAITAOF count the writes of their own
-- connection, and a repeat on a fresh one that wrote nothing would be acknowledged
-- by replicas that never received the post (the re-set is propagated after it).

local id, retention_ms, outcome, allowance = settle_args()
if not id then return retention_ms end
local hold = load_hold_for_post(id)
if not hold then return {'not_found', '', ''} end
local amounts, err = amounts_for(hold, 7)
if not amounts then return err end

if hold.st == 'posted' then
  if same_numbers(hold.posted, amounts) then
    redis.call('HSET', hkey(id), 'st', 'posted')
    return {'exists', 'posted', ''}
  end
  return {'exists_with_different_amount', 'posted', ''}
end
if hold.st ~= 'pending' and hold.st ~= 'ambiguous' and hold.st ~= 'expired' then
  return {'conflict', hold.st, ''}
end

local now = now_ms()
local dpend = pending_release(hold)
local accounts = load_balances(hold.held)
for i = 1, #hold.accounts do
  local a = accounts[i]
  -- A missing account (closed while the hold was expired) comes back empty below.
  if a and a.pend + dpend[i] + posted_after_roll(a, now) + amounts[i] > MAX_AMOUNT then
    return {'bad_input', 'amount', 'would take ' .. a.id .. ' past 2^53-1'}
  end
end
reopen_closed(id, hold.accounts, accounts, now)
local flags = {}
if hold.st == 'expired' then
  flags[#flags + 1] = 'late'
end
local post_ws = {}
for i = 1, #hold.accounts do
  local a = accounts[i]
  roll(a, now)
  a.pend, a.post = a.pend + dpend[i], a.post + amounts[i]
  if amounts[i] > hold.amounts[i] then
    if flags[#flags] ~= 'overrun' then
      flags[#flags + 1] = 'overrun'
    end
    redis.call('HINCRBY', ACCOUNTS, field(a.id, 'over'), '1')
  end
  post_ws[i] = a.ws
end
save_accounts(accounts)
local flag_text = table.concat(flags, ',')
local pst = join_numbers(amounts)
local fields = {'pst', pst, 'pws', join_numbers(post_ws), 'tp', fmt(now)}
local entry = {'op', 'post', 'hold', id, 'acc', hold.acc, 'pst', journal_numbers(amounts, pst)}
if hold.st ~= 'expired' then
  entry[#entry + 1], entry[#entry + 2] = 'rel', journal_numbers(hold.amounts, hold.amt)
end
if #flag_text > 0 then
  fields[#fields + 1], fields[#fields + 2] = 'flag', flag_text
  entry[#entry + 1], entry[#entry + 2] = 'flag', flag_text
end
local kept, short = kept_within(outcome, allowance)
fields = settle_fields(hold.st, kept, retention_ms, fields)
set_state(id, hold.st, 'posted', retention_ms, fields, hold.cr)
journal(entry)
if short then
  -- Only in the reply: the hold's and the journal's flags are about its amounts.
  flags[#flags + 1] = 'body_omitted'
end
return {'ok', 'posted', table.concat(flags, ',')}
