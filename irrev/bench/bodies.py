"""`irrev bench bodies`: what refusing a heavy body costs the gateway, against what
parsing the same bytes as plain JSON (or splitting a form) costs: the C parser with
no checks, the least any gateway that reads the body pays. The bodies are the ones a
hostile agent sent (issue 26): a 1 MB object of 60,000 keys, a 1 MB string in a
pass-through field, a 1 MB form of 60,000 fields, 100,000 levels of nesting; and an
honest 1 KB order, which is parsed whole, for scale. Each is timed `--runs` times,
interleaved with its baseline; medians are printed (CPU time of this process)."""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

from gateway.edge.canonical import read_request
from gateway.edge.problems import Problem
from irrev.cli import bounded

JSON = ["application/json"]
FORM = ["application/x-www-form-urlencoded"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=bounded(int, 3, 1000), default=21, help="runs per body")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(func=run)


def bodies() -> dict[str, tuple[list[str], bytes]]:
    keys = {f"k{i}": i for i in range(60_000)}
    order = {"supplier_id": "s1", "sku": "bolts", "quantity": 10, "unit_price": "95.50"}
    return {
        "60,000 keys": (JSON, json.dumps(keys).encode()),
        "1 MB string": (JSON, json.dumps({**order, "note": "x" * 1_000_000}).encode()),
        "60,000 form fields": (FORM, "&".join(f"f{i}={i}" for i in range(60_000)).encode()),
        "100,000 levels": (JSON, b"[" * 100_000 + b"]" * 100_000),
        "honest 1 KB order": (JSON, json.dumps({**order, "note": "n" * 900}).encode()),
    }


def refusal(content_types: list[str], body: bytes) -> str:
    try:
        read_request("", content_types, body)
    except Problem as problem:
        return problem.reason
    return "parsed"


def baseline(content_types: list[str], body: bytes) -> None:
    if content_types is FORM:
        body.split(b"&")
        return
    with contextlib.suppress(RecursionError):
        json.loads(body)


def cpu_ms(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return (time.process_time() - started) * 1000


def run(args: argparse.Namespace) -> int:
    rows = []
    for name, (content_types, body) in bodies().items():
        ours, plain = [], []
        for _ in range(args.runs):
            ours.append(cpu_ms(partial(refusal, content_types, body)))
            plain.append(cpu_ms(partial(baseline, content_types, body)))
        mine, theirs = statistics.median(ours), statistics.median(plain)
        rows.append(
            {
                "body": name,
                "bytes": len(body),
                "answer": refusal(content_types, body),
                "irrev_ms": round(mine, 3),
                "plain_parse_ms": round(theirs, 3),
                "ratio": round(mine / theirs, 2) if theirs else None,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'body':<20} {'bytes':>9} {'answer':<18} {'irrev ms':>9} {'plain ms':>9} {'ratio':>6}")
    for row in rows:
        print(
            f"{row['body']:<20} {row['bytes']:>9} {row['answer']:<18} {row['irrev_ms']:>9.3f} "
            f"{row['plain_parse_ms']:>9.3f} {row['ratio'] if row['ratio'] is not None else '-':>6}"
        )
    return 0
