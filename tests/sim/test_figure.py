"""What the figures and tables claim: the series and markers they are drawn from."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation

from sim import experiments, figure, report
from sim.experiments import Experiment, World

Row = dict[str, object]


def _run(exp: Experiment, seeds: int, arms: set[str] | None = None) -> tuple[Experiment, list[Row]]:
    if arms is not None:
        cases = tuple(replace(c, arms=tuple(a for a in c.arms if a[0] in arms)) for c in exp.cases)
        exp = replace(exp, cases=cases)
    rows = [row for case in exp.cases for row in experiments.run_case(case, seeds)]
    return exp, rows


def _axes(fig: Figure) -> dict[str, Axes]:
    """The top three panels by their y label, the others by their title."""
    out = {}
    for ax in fig.axes:
        label = ax.get_ylabel()
        key = label.split()[0] if ax.get_title() == "" else ax.get_title().split(":")[0]
        out[key] = ax
    return out


def _num(row: Row, key: str) -> float:
    value = row[key]
    assert isinstance(value, int | float)
    return float(value)


def _lines(ax: Axes) -> set[tuple[float, ...]]:
    return {tuple(float(y) for y in np.asarray(line.get_ydata())) for line in ax.get_lines()}


def _published(ax: Axes) -> list[tuple[float, float]]:
    return [
        (float(x), float(y))
        for c in ax.collections
        if c.get_gid() == figure.PUBLISHED
        for x, y in np.asarray(c.get_offsets())
    ]


def test_published_markers_only_in_the_published_world() -> None:
    """The audit: at N = 1000 the corr figure starred the published 0.67 R (an N = 50
    figure) over a 0.48 R bar. Published figures now carry their world."""
    big, rows = _run(experiments.correlated((1000,)), 2, {"local", "budget-stress"})
    assert big.comparable() == {}
    fig = figure.figure(big, rows)
    assert all(_published(ax) == [] for ax in fig.axes)
    small, rows = _run(experiments.correlated((50,)), 2, {"local", "budget-stress"})
    pubs = small.comparable()
    assert {k[1] for k in pubs} == {"local", "budget-stress"}
    fig = figure.figure(small, rows)
    axes = _axes(fig)
    exposure = sorted(y for _, y in _published(axes["exposure"]))
    assert exposure == sorted(p.exposure for p in pubs.values() if p.exposure is not None)


def test_a_mispriced_world_shows_no_published_figure() -> None:
    """`--misprice` changes the world: no published number beside its rows, in the
    figure, the table or the JSON."""
    exp = World(misprice=1.5).apply(experiments.e1((50,)))
    exp, rows = _run(exp, 2, {"local", "budget", "cap"})
    assert exp.published and exp.comparable() == {}
    assert all(_published(ax) == [] for ax in figure.figure(exp, rows).axes)
    table = report.table(exp, rows)
    column = next(c for c in table.columns if str(c.header).startswith("published"))
    assert all(cell == "" for cell in column._cells)


def test_utility_panels_carry_the_published_utility() -> None:
    exp, rows = _run(experiments.e1((50,)), 2, {"local", "budget", "cap"})
    axes = _axes(figure.figure(exp, rows))
    utilities = sorted(y for _, y in _published(axes["utility"]))
    assert utilities == [0.10, 0.1996, 1.00]
    # the star sits over its own arm's bar
    bars = {
        round(p.get_x() + p.get_width() / 2): p.get_height()
        for p in axes["utility"].patches
        if isinstance(p, Rectangle)
    }
    budget = next(r for r in rows if r["arm"] == "budget")
    x = next(x for x, y in _published(axes["utility"]) if y == 0.1996)
    assert bars[round(x)] == budget["utility"]


def test_the_calibration_figure_draws_window_2() -> None:
    """Its claim is about the second window: every top panel draws that window's
    figures, not the two windows' sums."""
    exp, rows = _run(experiments.calibration((50,), (1.0, 2.0)), 3)
    axes = _axes(figure.figure(exp, rows))
    for panel, key in (("P(overdraw)", "p_overdraw_last"), ("utility", "util_last")):
        drawn = _lines(axes[panel])
        for arm in ("budget", "irrev", "irrev-cal"):
            want = tuple(r[key] for r in rows if r["arm"] == arm)
            assert want in drawn, (panel, arm)
    exposure = _lines(axes["exposure"])
    assert tuple(r["exposure_last"] for r in rows if r["arm"] == "irrev") in exposure
    assert tuple(r["exposure"] for r in rows if r["arm"] == "irrev") not in exposure


def test_gated_boxes_keep_their_own_scale_beside_an_ungated_arm() -> None:
    exp, rows = _run(experiments.e1((50,)), 3, {"local", "budget", "irrev"})
    fig = figure.figure(exp, rows)
    where = {
        str(p.get_gid()).split("|")[1]: ax
        for ax in fig.axes
        for p in ax.patches
        if p.get_gid() and "|" in str(p.get_gid())
    }
    assert where["local"] is not where["budget"] and where["budget"] is where["irrev"]
    local = next(r for r in rows if r["arm"] == "local")
    q = local["worst_window_q"]
    assert isinstance(q, list | tuple)
    # the gated axis ends below the ungated arm's box: its boxes are not squashed by it
    assert where["budget"].get_ylim()[1] < q[3]


def test_the_grid_scatter_points_are_labelled() -> None:
    exp = experiments.pareto((50,), (20,), (1.0, 2.0), (0,))
    exp, rows = _run(exp, 2, {"budget", "irrev"})
    trade = _axes(figure.figure(exp, rows))["utility vs exposure"]
    labels = sorted(t.get_text() for t in trade.texts)
    assert labels == sorted(str(r["case"]) for r in rows)
    points = sorted(
        (round(float(t.xy[0]), 12), round(float(t.xy[1]), 12))
        for t in trade.texts
        if isinstance(t, Annotation)
    )
    want = sorted((round(_num(r, "exposure"), 12), round(_num(r, "utility"), 12)) for r in rows)
    assert points == want
