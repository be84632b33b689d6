-- lease_release: give a lease up early (ledger/lease.py), so the next holder need
-- not wait for it to lapse.
--
-- KEYS[1]  the lease key
-- ARGV[1]  the caller's token
--
-- Returns 1 if the caller held the lease and it is now free, 0 otherwise.
--
-- Invariant: only the holder frees a lease; a lapsed lease that someone else took
-- since is theirs and stays.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
