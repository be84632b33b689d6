"""The ledger's bounds, each defined once for every layer above the scripts.

`MAX_AMOUNT`: amounts (and TTLs, windows) are integers in [0, 2^53 - 1], exact in a
Lua double and in a JSON number. `MAX_ACCOUNTS`: one hold debits at most 8 accounts
(tenant, principal, agent and up to five risk factors). `MAX_ID_CHARS`: an account,
hold or other id is at most 128 characters. The Lua scripts state the
same numbers in `lua/_lib.lua` (tests/ledger/test_bad_input.py reads them there);
pricing refuses a policy amount or face value above `MAX_AMOUNT`, and the gateway a
request field above it. This module imports nothing, so any layer may import it.
"""

from __future__ import annotations

MAX_AMOUNT = 2**53 - 1
MAX_ACCOUNTS = 8
MAX_ID_CHARS = 128
