-- What the EVALSHA form of the ledger's scripts (Redis 6.2, ledger/scripts.py) runs
-- in place of _lib.lua's statements of the same names. Not a script on its own.
--
-- An EVALSHA script's top level runs on every call: a cache made there is built and
-- dropped on every call, so it would only add its lookups and stores to the work it
-- saves nothing of. Here `remembering` hands back `make` itself (its callers call it
-- directly, at no extra cost), and an account's field name is made when asked for,
-- without the table of all nine that names_of keeps on Redis 7.

local function remembering(make)
  return make
end

local function field(id, name)
  return id .. '|' .. name
end
