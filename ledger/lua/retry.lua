-- retry: the gateway is about to send an ambiguous effect again (same
-- Idempotency-Key). It claims the hold for that one send: the claim lives until
-- now + window (Redis time), and a second retry while it lives gets 'in_flight', so
-- however many repeats of the key arrive at once, one of them reaches the upstream.
-- The deadline moves to now + window as well, so that a reconciler told "not found"
-- by the upstream while this request may still be on its way cannot void it (void
-- with due_only refuses a hold whose deadline has not passed).
--
-- KEYS     accounts, journal, deadlines, ambiguous, escalated, hold, payload (_lib.lua)
-- ARGV[1]  hold id
-- ARGV[2]  window_ms: how long the request may be in flight (1..2^53-1)
--
-- Returns {status, state, flags}
--   'ok'         claimed: still ambiguous, claim and deadline at least now + window_ms;
--                flags = the claim (its end, ms): the claimer passes it to
--                ambiguous.lua, which ends only that claim
--   'in_flight'  another retry's claim is live; flags = ms until it lapses. Do not send
--   'conflict'   the hold is no longer ambiguous (state names it): do not send
--   'not_found', 'bad_input' (state = field, flags = message)
--
-- Invariant: no balance changes and no state changes; at most one live claim per
-- hold (the `rc` field, ms). ambiguous.lua given this claim clears it when the
-- claimed send turns out ambiguous again, post and void by settling the hold; a
-- claimer that dies leaves it to lapse. A later claim ends later than any earlier
-- one (it starts after that one lapsed), so its end names it. An ambiguous hold's deadline only ever moves later, so a void that waits
-- for it never overtakes a forward.

local id, err = hold_id_arg()
if not id then return err end
local window_ms = uint(ARGV[2], MAX_AMOUNT)
if not window_ms or window_ms < 1 or #ARGV ~= 2 then
  return {'bad_input', 'window_ms', 'must be an integer in [1, 2^53-1]'}
end
local hold = load_hold(id)
if not hold then return {'not_found', '', ''} end
if hold.st ~= 'ambiguous' then return {'conflict', hold.st, ''} end
local now = now_ms()
local claimed = tonumber(redis.call('HGET', hkey(id), 'rc') or '0')
if claimed > now then return {'in_flight', 'ambiguous', fmt(claimed - now)} end
local until_ms = now + window_ms
redis.call('HSET', hkey(id), 'rc', fmt(until_ms))
if until_ms > hold.deadline then
  redis.call('HSET', hkey(id), 'dl', until_ms)
end
return {'ok', 'ambiguous', fmt(until_ms)}
