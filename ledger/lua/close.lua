-- close: remove risk-factor accounts that hold nothing once their window is over. A
-- factor account is opened per concrete factor on first use (a payee, a supplier), so
-- an agent paying many new payees a micro-amount each would otherwise leave an
-- account per payee in the tenant's hash for good; closed, the next effect on the
-- factor opens it again from its pattern (reserve.lua), as new.
--
-- KEYS     accounts, journal (_lib.lua)
-- ARGV[1]  n (1..500), then n account ids: `factor:...` or `shadow:factor:...`
--
-- Returns {'ok', closed}   how many of the named accounts were closed; the others
--                          (missing, not idle, or still in their first window) are
--                          left as they were, but for a window roll (journaled)
--         {'bad_input', field, message}   nothing written
--
-- An account is closed when, with its window rolled to now, it has nothing pending
-- or posted, no overrun counted, no temporary raise, and its window started before
-- the current one: it has outlived the window it was used in. Journaled as op
-- `close` with the account, which replay drops (ledger/journal.py).
--
-- Invariant: no account that holds anything, or whose overruns or raises are on
-- record, is closed; balances change only by the roll, which is journaled as every
-- roll is.

local n = uint(ARGV[1], 500)
if not n or n < 1 or #ARGV ~= 1 + n then
  return {'bad_input', 'accounts', 'must name 1 to 500 accounts'}
end
for i = 1, n do
  local id = ARGV[1 + i]
  if not valid_id(id) or not (string.find(id, '^factor:.') or string.find(id, '^shadow:factor:.')) then
    return {'bad_input', 'accounts', 'only risk-factor accounts are closed when idle'}
  end
end

local now = now_ms()
local closed = 0
for i = 1, n do
  local id = ARGV[1 + i]
  local a = load_account(id)
  if a then
    local started = a.ws
    roll(a, now)
    local raise = redis.call('HGET', ACCOUNTS, field(id, 'raise'))
    if a.pend == 0 and a.post == 0 and (a.over or 0) == 0 and not raise
        and a.win > 0 and started < a.ws then
      local names = {}
      for j = 1, #ACCOUNT_FIELDS do
        names[j] = field(id, ACCOUNT_FIELDS[j])
      end
      names[#names + 1] = field(id, 'pv')
      redis.call('HDEL', ACCOUNTS, unpack(names))
      journal({'op', 'close', 'acct', id})
      closed = closed + 1
    else
      save_accounts({a})
    end
  end
end
return {'ok', closed}
