"""`irrev bench escrow` on the cluster: both modes admit, the escrowed tenant's Redis
CPU lands on every primary, and the figures it prints are the rounds' medians."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from irrev.bench.rounds import compared
from irrev.cli import main
from ledger import cluster_enabled


def test_the_bench_spreads_an_escrowed_tenant_over_the_primaries(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if not cluster_enabled(redis_url):
        pytest.skip("escrow spreads a tenant over a cluster's primaries")
    argv = ["bench", "escrow", "--url", redis_url, "--seconds", "0.5"]
    assert main([*argv, "--processes", "1", "--clients", "4", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    rounds = found["rounds"]
    assert {r["mode"] for r in rounds} == {"one slot", "escrow"}
    assert all(r["admissions_per_s"] > 0 for r in rounds)
    for r in rounds:
        assert len(r["shares"]) == 3 and abs(sum(r["shares"]) - 1) < 1e-9
    # Each shard's primary served some of the escrowed tenant's work; the tenant in
    # one slot left two primaries nearly idle (their cluster chores only).
    escrowed = [r for r in rounds if r["mode"] == "escrow"]
    assert all(min(r["shares"]) > 0.1 for r in escrowed)
    figures = found["figures"]
    assert set(figures) == {"one slot", "escrow", "escrow_vs_one_slot"}


def test_rounds_of_two_modes_compare_by_their_medians() -> None:
    @dataclass(frozen=True)
    class Timed:
        mode: str
        rate: float

    rounds = [Timed("alone", 10), Timed("grouped", 30), Timed("alone", 30), Timed("grouped", 5)]
    rounds += [Timed("alone", 20), Timed("grouped", 40)]
    found = compared(rounds, "alone", "grouped", {"rate": lambda r: r.rate})
    assert found == {
        "alone": {"rate": 20},
        "grouped": {"rate": 30},
        "grouped_vs_alone": {"rate": 1.5},
    }
