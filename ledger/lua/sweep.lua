-- sweep: expire due holds of one tenant, at most a batch per call (lazy expiry in
-- reserve handles a few per admission; the sweeper does the rest).
--
-- KEYS[1]  tenant key prefix `irrev:{<tenant>}:`
-- ARGV[1]  batch: at most this many holds (1..1000)
-- ARGV[2]  retention_ms for the settled records (0 keeps them)
--
-- Returns {status, visited, remaining_due}
--   'ok'         visited holds were expired or made ambiguous by expire_due's rule
--   'bad_input'  (visited = field, remaining_due = message)
--
-- Invariant: the rule of expire_due: nothing is released on a guess.

local batch = uint(ARGV[1], 1000)
if not batch or batch < 1 then return {'bad_input', 'batch', 'must be an integer in [1, 1000]'} end
local retention_ms, err = retention_arg()
if not retention_ms then return err end
local now = now_ms()
local visited = expire_due(now, batch, retention_ms)
return {'ok', visited, redis.call('ZCOUNT', DEADLINES, '-inf', now)}
