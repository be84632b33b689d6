"""Bad input raises a typed error and writes nothing, whether it is caught by the
Python API or, sent raw past it, by the script itself (contract 8)."""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

import pytest

from ledger.client import Ledger
from ledger.errors import BadInput, LedgerUnavailable, UnknownAccount
from ledger.keys import hold_script_keys, payload_key, reserve_keys, rules_key, tenant_keys
from ledger.limits import MAX_ACCOUNTS, MAX_AMOUNT
from ledger.records import Verdict

from .conftest import open_accounts
from .helpers import tenant_snapshot

HOUR_MS = 3_600_000
TOO_BIG = MAX_AMOUNT + 1


@pytest.fixture
async def seeded(ledger: Ledger, tenant: str) -> Ledger:
    await open_accounts(ledger, tenant, tenant_acme=1000, agent_a=500)
    await ledger.reserve(tenant, "held", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
    await ledger.reserve(tenant, "posted", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
    await ledger.post(tenant, "posted", 100)
    return ledger


BAD_RESERVES: list[tuple[str, dict[str, Any], str]] = [
    ("negative", {"amounts": {"tenant:acme": -1}}, "amount"),
    ("float", {"amounts": {"tenant:acme": 1.5}}, "amount"),
    ("bool", {"amounts": {"tenant:acme": True}}, "amount"),
    ("string-amount", {"amounts": {"tenant:acme": "10"}}, "amount"),
    ("above-2^53", {"amounts": {"tenant:acme": TOO_BIG}}, "amount"),
    ("empty-accounts", {"amounts": {}}, "accounts"),
    (
        "too-many-accounts",
        {"amounts": {f"agent:a{i}": 1 for i in range(MAX_ACCOUNTS + 1)}},
        "accounts",
    ),
    ("bad-kind", {"amounts": {"wallet:a": 1}}, "account"),
    ("no-kind", {"amounts": {"acme": 1}}, "account"),
    ("space-in-account", {"amounts": {"agent:a b": 1}}, "account"),
    ("long-account", {"amounts": {"agent:" + "a" * 128: 1}}, "account"),
    ("bad-key", {"key": "a key"}, "idempotency_key"),
    ("empty-key", {"key": ""}, "idempotency_key"),
    ("long-key", {"key": "k" * 129}, "idempotency_key"),
    ("unicode-key", {"key": "k\u00e9y"}, "idempotency_key"),
    ("newline-fingerprint", {"fingerprint": "fp\n"}, "fingerprint"),
    ("negative-ttl", {"ttl_ms": -1}, "ttl_ms"),
    ("float-ttl", {"ttl_ms": 1.0}, "ttl_ms"),
    ("huge-ttl", {"ttl_ms": TOO_BIG}, "ttl_ms"),
    ("negative-threshold", {"escalate_above": -5}, "escalate_above"),
]


@pytest.mark.parametrize(
    ("change", "field"), [c[1:] for c in BAD_RESERVES], ids=[c[0] for c in BAD_RESERVES]
)
async def test_api_rejects_bad_reserve(
    seeded: Ledger, tenant: str, change: dict[str, Any], field: str
) -> None:
    call: dict[str, Any] = {
        "key": "new",
        "fingerprint": "fp",
        "amounts": {"tenant:acme": 10},
        "ttl_ms": HOUR_MS,
    }
    call.update(change)
    before = await tenant_snapshot(seeded, tenant)
    with pytest.raises(BadInput) as caught:
        await seeded.reserve(
            tenant, call.pop("key"), call.pop("fingerprint"), call.pop("amounts"), **call
        )
    assert caught.value.field == field
    assert await tenant_snapshot(seeded, tenant) == before


@pytest.mark.parametrize("tenant_id", ["", "a{b}", "a:b", "t" * 65, "\u00e9"])
async def test_api_rejects_bad_tenant(seeded: Ledger, tenant_id: str) -> None:
    with pytest.raises(BadInput) as caught:
        await seeded.reserve(tenant_id, "k", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
    assert caught.value.field == "tenant"


async def test_unknown_account_writes_nothing(seeded: Ledger, tenant: str) -> None:
    before = await tenant_snapshot(seeded, tenant)
    with pytest.raises(UnknownAccount) as caught:
        await seeded.reserve(
            tenant, "new", "fp", {"tenant:acme": 1, "agent:ghost": 1}, ttl_ms=HOUR_MS
        )
    assert caught.value.account == "agent:ghost"
    assert await tenant_snapshot(seeded, tenant) == before


@pytest.mark.parametrize(
    ("operation", "call"),
    [
        ("post-negative", lambda lg, t: lg.post(t, "held", -1)),
        ("post-float", lambda lg, t: lg.post(t, "held", 0.5)),
        ("post-huge", lambda lg, t: lg.post(t, "held", TOO_BIG)),
        ("post-wrong-accounts", lambda lg, t: lg.post(t, "held", {"agent:a": 1})),
        ("compensate-too-much", lambda lg, t: lg.compensate(t, "posted", 101)),
        ("compensate-bad-id", lambda lg, t: lg.compensate(t, "po sted", 1)),
        ("ambiguous-bad-reason", lambda lg, t: lg.mark_ambiguous(t, "held", "no reason")),
        ("approve-bad-approver", lambda lg, t: lg.approve(t, "held", "", ttl_ms=1)),
        ("approve-negative-ttl", lambda lg, t: lg.approve(t, "held", "alice", ttl_ms=-1)),
        ("account-soft-above-limit", lambda lg, t: lg.upsert_account(t, _spec(10, 11))),
        ("account-negative-limit", lambda lg, t: lg.upsert_account(t, _spec(-1, 0))),
    ],
)
async def test_api_rejects_bad_transitions(
    seeded: Ledger, tenant: str, operation: str, call: Any
) -> None:
    before = await tenant_snapshot(seeded, tenant)
    with pytest.raises(BadInput):
        await call(seeded, tenant)
    assert await tenant_snapshot(seeded, tenant) == before


def _spec(limit: int, soft: int) -> Any:
    from ledger.records import AccountSpec

    return AccountSpec(account="agent:z", limit=limit, soft_limit=soft)


# A reserve of 1 on factor:x that opens one account, whose spec follows.
OPEN_ONE = ["k", "fp", "100", "0", "1", "0", "0", "", "", "1", "factor:x", "1", "0", "1"]
RAW: list[tuple[str, str, list[str]]] = [
    (
        "reserve-1e3",
        "reserve",
        ["k", "fp", "1e3", "0", "1", "0", "0", "", "", "1", "tenant:acme", "5"],
    ),
    (
        "reserve-hex",
        "reserve",
        ["k", "fp", "100", "0", "1", "0", "0", "", "", "1", "tenant:acme", "0x10"],
    ),
    (
        "reserve-neg",
        "reserve",
        ["k", "fp", "100", "0", "1", "0", "0", "", "", "1", "tenant:acme", "-5"],
    ),
    (
        "reserve-2^53",
        "reserve",
        ["k", "fp", "100", "0", "1", "0", "0", "", "", "1", "tenant:acme", str(TOO_BIG)],
    ),
    (
        "reserve-nan",
        "reserve",
        ["k", "fp", "100", "0", "1", "0", "0", "", "", "1", "tenant:acme", "nan"],
    ),
    (
        "reserve-dup",
        "reserve",
        ["k", "fp", "100", "0", "1", "0", "0", "", "", "2", "tenant:acme", "1", "tenant:acme", "1"],
    ),
    (
        "reserve-short",
        "reserve",
        ["k", "fp", "100", "0", "1", "0", "0", "", "", "2", "tenant:acme", "1"],
    ),
    (
        "reserve-armed",
        "reserve",
        ["k", "fp", "100", "0", "yes", "0", "0", "", "", "1", "tenant:acme", "1"],
    ),
    ("reserve-0-accts", "reserve", ["k", "fp", "100", "0", "1", "0", "0", "", "", "0"]),
    (
        "reserve-too-many-accts",
        "reserve",
        [
            *["k", "fp", "100", "0", "1", "0", "0", "", "", str(MAX_ACCOUNTS + 1)],
            *[arg for i in range(MAX_ACCOUNTS + 1) for arg in (f"agent:a{i}", "1")],
            *["0", "0"],
        ],
    ),
    (
        "reserve-open-stranger",
        "reserve",
        [*OPEN_ONE, "factor:y", "10", "10", "0", "0"],
    ),
    (
        "reserve-open-soft",
        "reserve",
        [*OPEN_ONE, "factor:x", "10", "11", "0", "0"],
    ),
    (
        "reserve-no-denied-retention",
        "reserve",
        ["k", "fp", "100", "0", "1", "0", "0", "", "", "1", "tenant:acme", "1", "", "0"],
    ),
    (
        "reserve-shadow",
        "reserve",
        ["k", "fp", "100", "0", "1", "0", "0", "", "", "1", "tenant:acme", "1", "0", "0", "yes"],
    ),
    (
        "reserve-pooled-without-alone",
        "reserve",
        # a tag, face value and pending 2, without the price alone that follows
        [
            "k",
            "fp",
            "100",
            "0",
            "1",
            "0",
            "0",
            "",
            "",
            "1",
            "tenant:acme",
            "1",
            "0",
            "0",
            "0",
            "0",
            "abc",
            "100",
            "2.0",
        ],
    ),
    ("post-float", "post", ["held", "0", "", "", "", "", "*", "1.5"]),
    ("post-extra", "post", ["held", "0", "", "", "", "", "*", "1", "2"]),
    ("post-stranger", "post", ["held", "0", "", "", "", "", "1", "agent:a", "1"]),
    ("post-no-outcome", "post", ["held", "0"]),
    ("void-extra", "void", ["held", "0", "", "", "", "", "x"]),
    ("compensate-neg", "compensate", ["posted", "0", "*", "-1"]),
    ("approve-ttl", "approve", ["held", "0", "-1", "alice"]),
    ("sweep-zero", "sweep", ["0", "0", "0"]),
    ("sweep-short", "sweep", ["0", "10", "1"]),
    ("sweep-count", "sweep", ["0", "10", "x"]),
    ("account-soft", "account", ["agent:z", "10", "11", "0", "0"]),
    ("account-kind", "account", ["nokind", "10", "10", "0", "0"]),
]


def _counted(args: list[str]) -> list[str]:
    """A raw reserve's arguments with its count-escalations flag ('1', reserve.lua's
    ARGV[13+2n+5m]) where it goes, so that a case refused for a later argument is
    refused for that one; one whose n or m is itself the fault is left as it is."""
    try:
        n = int(args[9])
        m = int(args[11 + 2 * n])
    except (ValueError, IndexError):
        return args
    at = 12 + 2 * n + 5 * m
    return [*args[:at], "1", *args[at:]] if len(args) >= at else args


RAW = [(name, op, _counted(args) if op == "reserve" else args) for name, op, args in RAW]


@pytest.mark.parametrize(("operation", "args"), [r[1:] for r in RAW], ids=[r[0] for r in RAW])
async def test_script_validates_before_writing(
    seeded: Ledger, tenant: str, operation: str, args: list[str]
) -> None:
    """Past the Python API, straight to the script: refused, and nothing written."""
    before = await tenant_snapshot(seeded, tenant)
    if operation == "account":
        keys = tenant_keys(tenant)[:2]
    elif operation == "sweep":
        keys = tenant_keys(tenant)
    else:
        keys = (reserve_keys if operation == "reserve" else hold_script_keys)(tenant, args[0])
    reply = await seeded._run(operation, keys, args)
    assert reply[0] == "bad_input"
    assert await tenant_snapshot(seeded, tenant) == before


@pytest.mark.parametrize(
    ("operation", "args"),
    [
        (
            "reserve",
            _counted(
                [
                    "k",
                    "fp",
                    "100",
                    "0",
                    "1",
                    "0",
                    "0",
                    "",
                    "",
                    "1",
                    "tenant:acme",
                    "1",
                    "0",
                    "0",
                    "0",
                ]
            ),
        ),
        ("void", ["held", "0", "", "", "", ""]),
        ("post", ["held", "0", "", "", "", "", "*", "100"]),
    ],
)
async def test_script_touches_only_the_hold_key_it_was_given(
    seeded: Ledger, tenant: str, operation: str, args: list[str]
) -> None:
    """A script never builds a key it was not given: one given the key of another
    hold than its id names is refused (during a slot migration, an undeclared key
    may be on the other node)."""
    before = await tenant_snapshot(seeded, tenant)
    keys = hold_script_keys(tenant, "posted")
    reply = await seeded._run(operation, keys, args)
    assert reply[:2] == ["bad_input", "keys"]
    assert await tenant_snapshot(seeded, tenant) == before
    # The right record, another hold's request.
    keys = [*hold_script_keys(tenant, args[0])[:6], payload_key(tenant, "posted")]
    reply = await seeded._run(operation, keys, args)
    assert reply[:2] == ["bad_input", "keys"]
    assert await tenant_snapshot(seeded, tenant) == before


# The bounds of ledger/limits.py, at every layer of the ledger: the scripts state them
# in _lib.lua, the Python API and the scripts accept each bound and refuse one more.
# (pricing: tests/pricing/test_money.py; gateway: tests/gateway/test_proxy.py.)


def _lua_constant(name: str) -> int:
    library = files("ledger.lua").joinpath("_lib.lua").read_text(encoding="utf-8")
    found = re.findall(rf"^local {name} = (\d+)$", library, re.MULTILINE)
    assert len(found) == 1, f"_lib.lua defines {name} {len(found)} times"
    return int(found[0])


def test_the_scripts_state_the_ledgers_bounds() -> None:
    assert _lua_constant("MAX_AMOUNT") == MAX_AMOUNT
    assert _lua_constant("MAX_ACCOUNTS") == MAX_ACCOUNTS
    for script in files("ledger.lua").iterdir():
        if script.name.endswith(".lua") and script.name != "_lib.lua":
            text = script.read_text(encoding="utf-8")
            # Only _lib.lua writes the numbers; scripts use its names.
            assert str(MAX_AMOUNT) not in text, script.name
            assert not re.search(r"local MAX_(AMOUNT|ACCOUNTS)\b", text), script.name


def _raw_reserve(amounts: dict[str, int]) -> list[str]:
    pairs = [arg for account, amount in amounts.items() for arg in (account, str(amount))]
    return _counted(
        ["k", "fp", "100", "0", "1", "0", "0", "", "", str(len(amounts)), *pairs, "0", "0", "0"]
    )


async def test_the_script_takes_the_largest_amount_and_refuses_one_more(
    seeded: Ledger, tenant: str
) -> None:
    prefix = reserve_keys(tenant, "k")
    over = await seeded._run("reserve", prefix, _raw_reserve({"tenant:acme": MAX_AMOUNT + 1}))
    assert over[0] == "bad_input"
    at = await seeded._run("reserve", prefix, _raw_reserve({"tenant:acme": MAX_AMOUNT}))
    # Read and checked against the limit: a valid amount, denied by the budget.
    assert at[:3] == ["ok", "deny", "budget_exceeded"]
    assert at[-1] == MAX_AMOUNT


async def test_the_script_takes_the_most_accounts_and_refuses_one_more(
    seeded: Ledger, tenant: str
) -> None:
    prefix = reserve_keys(tenant, "k")
    accounts = {f"agent:a{i}": 1 for i in range(MAX_ACCOUNTS + 1)}
    over = await seeded._run("reserve", prefix, _raw_reserve(accounts))
    assert over[:2] == ["bad_input", "accounts"]
    del accounts["agent:a0"]
    at = await seeded._run("reserve", prefix, _raw_reserve(accounts))
    assert at[0] == "unknown_account"  # past the count check, to the accounts themselves


async def test_the_api_takes_each_bound(seeded: Ledger, tenant: str) -> None:
    result = await seeded.reserve(tenant, "at-max", "fp", {"tenant:acme": MAX_AMOUNT}, ttl_ms=1)
    assert result.decision is Verdict.DENY
    accounts = {f"agent:a{i}": 1 for i in range(MAX_ACCOUNTS)}
    with pytest.raises(UnknownAccount):
        await seeded.reserve(tenant, "at-max-accounts", "fp", accounts, ttl_ms=HOUR_MS)


@pytest.mark.parametrize(
    ("operation", "args", "position"),
    [
        ("void", ["held", "0", "", "", "", ""], 2),
        ("void", ["held", "0", "", "", "", ""], 3),
        ("reject", ["escalated", "0", "ops", ""], 5),
        ("ambiguous", ["held", "upstream_timeout"], 4),
        ("account", ["agent:z", "10", "10", "0", "0"], 2),
        ("rule", ["delete", "r1", "ops"], 3),
    ],
)
async def test_script_touches_only_its_tenants_keys(
    seeded: Ledger, tenant: str, operation: str, args: list[str], position: int
) -> None:
    """Every key a script is given is checked against the tenant of KEYS[1]: one that
    names another tenant's journal, deadlines, queues or rules (or the wrong key of
    its own) is refused before anything is written, to either tenant."""
    victim = f"{tenant}-victim"
    if operation == "account":
        keys = tenant_keys(tenant)[:2]
    elif operation == "rule":
        keys = [*tenant_keys(tenant)[:2], rules_key(tenant)]
    else:
        keys = (reserve_keys if operation == "reserve" else hold_script_keys)(tenant, args[0])
    keys[position - 1] = (
        rules_key(victim) if operation == "rule" else tenant_keys(victim)[position - 1]
    )
    before = await tenant_snapshot(seeded, tenant), await tenant_snapshot(seeded, victim)
    # (A cluster client refuses keys of two slots before sending anything.)
    refused = rf"KEYS\[{position}\]|same slot"
    with pytest.raises(LedgerUnavailable, match=refused):
        await seeded._run(operation, keys, args)
    assert (await tenant_snapshot(seeded, tenant), await tenant_snapshot(seeded, victim)) == before


async def test_script_refuses_its_own_tenants_keys_out_of_place(
    seeded: Ledger, tenant: str
) -> None:
    """KEYS[2..5] must each be the one key of the tenant that their place names, and
    KEYS[1] the tenant's accounts: the tenant's own deadlines in the journal's place,
    or its journal in the accounts' place, is refused before anything is written (also
    after calls that checked the right keys, which Redis 7 remembers)."""
    args = ["held", "0", "", "", "", ""]
    keys = hold_script_keys(tenant, "held")
    before = await tenant_snapshot(seeded, tenant)
    swapped = [keys[0], keys[2], keys[1], *keys[3:]]
    with pytest.raises(LedgerUnavailable, match=r"KEYS\[2\]"):
        await seeded._run("void", swapped, args)
    with pytest.raises(LedgerUnavailable, match=r"KEYS\[1\]"):
        await seeded._run("void", [keys[1], *keys[1:]], args)
    assert await tenant_snapshot(seeded, tenant) == before
