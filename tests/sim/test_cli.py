from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from irrev.cli import main
from sim import experiments, metrics, runner, workload

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow


def test_sim_writes_table_json_csv_png_svg_pdf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "e1", "--seeds", "4", "--out", str(tmp_path)]) == 0
    assert "irrev-stressed" in capsys.readouterr().out
    data = json.loads((tmp_path / "e1.json").read_text())
    assert {r["arm"] for r in data["rows"]} >= {"local", "budget", "breaker-10", "irrev"}
    assert (tmp_path / "e1.csv").read_text().startswith("case,")
    assert (tmp_path / "e1.png").stat().st_size > 0
    assert (tmp_path / "e1.svg").read_text().lstrip().startswith("<?xml")
    assert (tmp_path / "e1.pdf").read_bytes().startswith(b"%PDF")


def test_rows_carry_the_per_seed_worst_window_quantiles_the_figure_draws(tmp_path: Path) -> None:
    # three windows, so a seed's worst window and its exposure summed over windows differ
    seeds = 5
    assert main(["sim", "windows", "--seeds", str(seeds), "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "windows.json").read_text())
    assert data["worst_window_q_percents"] == [0, 1, 5, 25, 50, 75, 95, 99, 100]
    (case,) = experiments.EXPERIMENTS["windows"]((50,)).cases
    wl = workload.build(case.scenario, range(case.seed0, case.seed0 + seeds))
    rows = {r["arm"]: r for r in data["rows"]}
    assert set(rows) == {label for label, _ in case.arms}
    for label, spec in case.arms:
        worst = metrics.per_seed(wl, runner.run(spec.build(wl), wl))["worst_window"]
        want = np.percentile(worst, data["worst_window_q_percents"])
        assert rows[label]["worst_window_q"] == pytest.approx(want.tolist(), rel=1e-12), label
        assert rows[label]["worst_window_q"][-1] == rows[label]["exposure_max"]
    header = (tmp_path / "windows.csv").read_text().splitlines()[0].split(",")
    assert "worst_window_q" not in header
    assert {f"worst_window_q{p}" for p in data["worst_window_q_percents"]} <= set(header)
    assert (tmp_path / "windows.pdf").read_bytes().startswith(b"%PDF")


def test_json_carries_version_commit_parameters_and_seed_block(tmp_path: Path) -> None:
    argv = ["sim", "e1", "--seeds", "3", "--seed0", "777", "--out", str(tmp_path)]
    assert main([*argv, "--misprice", "1.5", "--settle-delay", "7"]) == 0
    data = json.loads((tmp_path / "e1.json").read_text())
    assert data["version"] and data["seed_blocks"] == [777] and data["seeds"] == 3
    assert data["commit"] is None or len(data["commit"].removesuffix("-dirty")) == 40
    (case,) = data["parameters"]
    assert case["seed0"] == 777 and case["scenario"]["model"]["misprice"] == 1.5
    assert case["arms"]["irrev"]["settle_delay"] == 7
    irrev = next(r for r in data["rows"] if r["arm"] == "irrev")
    assert irrev["settle_delay"] == 7 and irrev["approval_latency"] == 0
    budget = next(r for r in data["rows"] if r["arm"] == "budget")
    assert budget["settle_delay"] is None and budget["approval_latency"] is None
    assert {"p_overdraw_lo", "p_overdraw_hi", "exposure_max", "shortfall"} <= set(irrev)


def test_top_limit_reaches_the_irrev_arms_only(tmp_path: Path) -> None:
    argv = ["sim", "e1", "--seeds", "2", "--out", str(tmp_path), "--top-limit", "0.6"]
    assert main(argv) == 0
    (case,) = json.loads((tmp_path / "e1.json").read_text())["parameters"]
    assert case["arms"]["irrev"]["top_limit_frac"] == 0.6
    assert "top_limit_frac" not in case["arms"]["budget"]


def test_sim_rejects_zero_seeds(tmp_path: Path) -> None:
    assert main(["sim", "e1", "--seeds", "0", "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize(
    "flags",
    [
        ["--settle-delay", "-1"],
        ["--burst-len", "990"],
        ["--misprice", "0"],
        ["--top-limit", "1.5"],
    ],
    ids=["negative-delay", "burst-longer-than-window", "zero-misprice", "top-limit-above-r"],
)
def test_sim_refuses_a_world_it_cannot_have(
    tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "e1", "--seeds", "2", "--out", str(tmp_path), *flags]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_sim_runs_only_the_arms_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "corr", "--seeds", "2", "--out", str(tmp_path), "--arms"]
    assert main([*argv, "irrev-stressed", "budget"]) == 0
    data = json.loads((tmp_path / "corr.json").read_text())
    assert {r["arm"] for r in data["rows"]} == {"irrev-stressed", "budget"}
    capsys.readouterr()
    assert main([*argv, "irrev-stresed"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "irrev-stresed" in err and "irrev-stressed" in err
