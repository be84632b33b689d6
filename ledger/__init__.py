"""irrev ledger: accounts, holds and the journal, kept atomically in Redis by Lua scripts."""
