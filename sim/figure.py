"""An experiment's figure, drawn from its rows: no files, so tests read its artists.

Top: P(overdraw), exposure, utility per case and arm (a line per arm for a sweep).
Bottom: the trade-off (utility against exposure) and every row's per-seed exposure
distribution. Published figures are drawn only beside rows run in the world they
were measured in (`Experiment.comparable`); an experiment whose claim is about its
last window (`last_window`) is drawn from that window alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.gridspec import SubplotSpec
from matplotlib.patches import Patch
from matplotlib.typing import ColorType

from sim.arms import Local
from sim.experiments import Experiment, Published
from sim.metrics import EXPOSURE_Q

Row = dict[str, object]
Pubs = dict[tuple[str, str], Published]
MARKERS = "os^Dv<>PXh"
PUBLISHED = "published"  # the gid of every published marker, so tests can find them
UNGATED = "ungated arms, own scale"


def _f(row: Row, key: str) -> float:
    value = row[key]
    assert isinstance(value, int | float)
    return float(value)


@dataclass(frozen=True)
class View:
    """Which columns a figure draws: over every window, or the last window alone."""

    p: str = "p_overdraw"
    exposure: str = "exposure"
    exposure_ci: str = "exposure_ci"
    exposure_max: str = "exposure_max"
    utility: str = "utility"
    utility_ci: str = "utility_ci"
    quantiles: str = "worst_window_q"
    windows: int = 1  # windows a mean exposure sums over, each within R


def view(exp: Experiment) -> View:
    if exp.last_window:
        return View(
            "p_overdraw_last",
            "exposure_last",
            "exposure_last_ci",
            "exposure_last_max",
            "util_last",
            "util_last_ci",
            "exposure_last_q",
        )
    return View(windows=max(c.scenario.model.windows for c in exp.cases))


def published(exp: Experiment) -> Pubs:
    """The published figures a figure may show: comparable ones, and none where it
    shows one window of several (the artifact's exposure sums its windows)."""
    return {} if exp.last_window else exp.comparable()


def _place(rows: list[Row], arms: list[str]) -> tuple[list[float], list[float], list[str]]:
    """x of every row's bar or box, grouped by case with a gap between cases and the
    arms in one order inside each (colour tells them apart), and the ticks: one per
    case, or one per arm when there is a single case."""
    cases = list(dict.fromkeys(str(r["case"]) for r in rows))
    width = len(arms) + 1
    xs = [float(cases.index(str(r["case"])) * width + arms.index(str(r["arm"]))) for r in rows]
    if len(cases) == 1:
        return xs, xs, [str(r["arm"]) for r in rows]
    return xs, [i * width + (len(arms) - 1) / 2 for i in range(len(cases))], cases


def _ticks(ax: Axes, ticks: list[float], labels: list[str], small: int) -> None:
    ax.set_xticks(ticks, labels)
    ax.tick_params(axis="x", rotation=60 if len(labels) > 6 else 0, labelsize=small)


def _log_if_wide(set_scale: Callable[[str], None], values: list[float]) -> None:
    # an ungated arm at 50 R flattens every gated one near R; a log axis shows both
    if min(values) > 0 and max(values) / min(values) > 50:
        set_scale("log")


def _r_label(v: View) -> str:
    return "R" if v.windows == 1 else f"{v.windows:g} R ({v.windows:g} windows, each within R)"


def _arm_colours(arms: list[str]) -> dict[str, ColorType]:
    # one colour per arm in every panel, so the legend of one panel reads them all
    cmap = colormaps["tab10" if len(arms) <= 10 else "tab20"]
    return {arm: cmap(i % cmap.N) for i, arm in enumerate(arms)}


def _star(ax: Axes, xs: list[float], ys: list[float], label: str | None) -> None:
    if xs:
        ax.scatter(xs, ys, marker="*", color="red", zorder=3, label=label, gid=PUBLISHED)


def figure(exp: Experiment, rows: list[Row]) -> Figure:
    """The whole figure of an experiment's rows (see the module doc)."""
    # a Figure of its own, not pyplot's: nothing global to select or to close
    fig = Figure(figsize=(18, 10))
    grid = fig.add_gridspec(2, 3)
    ax_p, ax_e, ax_u = (fig.add_subplot(grid[0, i]) for i in range(3))
    ax_t = fig.add_subplot(grid[1, 0])
    colour = _arm_colours(list(dict.fromkeys(str(r["arm"]) for r in rows)))
    v, pubs = view(exp), published(exp)
    small = 6 if len(rows) > 20 else 8
    sweep = len({str(r["case"]) for r in rows}) > 1 and bool(exp.x_label)
    if sweep:
        _sweep_lines(exp, rows, colour, (ax_p, ax_e, ax_u))
    else:
        _case_bars(exp, rows, colour, (ax_p, ax_e, ax_u), small)
    _log_if_wide(ax_e.set_yscale, [_f(r, k) for r in rows for k in (v.exposure, v.exposure_max)])
    _trade_off(exp, rows, ax_t, colour)
    _per_seed_panels(exp, rows, fig, grid[1, 1:], colour, small)
    ax_e.axhline(v.windows, color="red", linestyle="--", linewidth=1, label=_r_label(v))
    which = " (last window)" if exp.last_window else ""
    ax_p.set_ylabel(f"P(overdraw){which}, 95% Wilson interval")
    worst = "dotted" if sweep else "tick"
    top = "its worst seed" if exp.last_window else "worst window"
    ax_e.set_ylabel(f"exposure / R{which} (mean, 95% CI; {worst}: {top})")
    ax_u.set_ylabel(f"utility{which} (executed / proposed value)")
    ax_e.legend(fontsize=7)
    if sweep or pubs:
        ax_u.legend(fontsize=7)
    if sweep:
        ax_p.legend(fontsize=7)
    seeds = int(_f(rows[0], "seeds"))
    fig.suptitle(f"{exp.title} ({seeds} seeds per case)")
    fig.tight_layout()
    return fig


def _wilson_err(rows: list[Row], key: str) -> list[list[float]]:
    # clipped: at 0 or n of n, the Wilson bound and the rate differ by rounding only
    return [
        [max(0.0, _f(r, key) - _f(r, key + "_lo")) for r in rows],
        [max(0.0, _f(r, key + "_hi") - _f(r, key)) for r in rows],
    ]


def _published_markers(
    pubs: Pubs, rows: list[Row], xs: list[float], ax_e: Axes, ax_u: Axes
) -> None:
    """Red stars at the published exposure and utility of the rows that have them."""
    at = [(x, pubs.get((str(r["case"]), str(r["arm"])))) for r, x in zip(rows, xs, strict=True)]
    exposure = [(x, p.exposure) for x, p in at if p is not None and p.exposure is not None]
    utility = [(x, p.utility) for x, p in at if p is not None and p.utility is not None]
    _star(ax_e, [x for x, _ in exposure], [e for _, e in exposure], PUBLISHED)
    _star(ax_u, [x for x, _ in utility], [u for _, u in utility], PUBLISHED)


def _sweep_lines(
    exp: Experiment, rows: list[Row], colour: dict[str, ColorType], axes: tuple[Axes, Axes, Axes]
) -> None:
    """A sweep's top panels: P(overdraw), exposure (and its worst window, dotted) and
    utility against the swept x, a line per arm; published figures as red stars."""
    ax_p, ax_e, ax_u = axes
    v = view(exp)
    for arm in colour:
        mine = [r for r in rows if r["arm"] == arm]
        xs = [_f(r, "x") for r in mine]
        panels = (
            (ax_p, v.p, _wilson_err(mine, v.p)),
            (ax_e, v.exposure, [_f(r, v.exposure_ci) for r in mine]),
            (ax_u, v.utility, [_f(r, v.utility_ci) for r in mine]),
        )
        for ax, key, err in panels:
            ax.errorbar(
                xs, [_f(r, key) for r in mine], yerr=err, marker="o", label=arm, c=colour[arm]
            )
        ax_e.plot(xs, [_f(r, v.exposure_max) for r in mine], linestyle=":", c=colour[arm])
    _published_markers(published(exp), rows, [_f(r, "x") for r in rows], ax_e, ax_u)
    for ax in axes:
        ax.set_xlabel(exp.x_label)
        if exp.x_label == "agents":
            ax.set_xscale("log")


def _case_bars(
    exp: Experiment,
    rows: list[Row],
    colour: dict[str, ColorType],
    axes: tuple[Axes, Axes, Axes],
    small: int,
) -> None:
    """The top panels of cases that are not a sweep: a bar per row (its worst window a
    tick), the published exposure and utility as red stars, and a legend of the arms'
    colours when there is more than one case."""
    ax_p, ax_e, ax_u = axes
    v = view(exp)
    xs, ticks, tick_labels = _place(rows, list(colour))
    colours = [colour[str(r["arm"])] for r in rows]
    ax_p.bar(xs, [_f(r, v.p) for r in rows], yerr=_wilson_err(rows, v.p), color=colours)
    ax_e.bar(
        xs,
        [_f(r, v.exposure) for r in rows],
        yerr=[_f(r, v.exposure_ci) for r in rows],
        color=colours,
    )
    ax_e.scatter(xs, [_f(r, v.exposure_max) for r in rows], marker="_", color="black")
    ax_u.bar(
        xs,
        [_f(r, v.utility) for r in rows],
        yerr=[_f(r, v.utility_ci) for r in rows],
        color=colours,
    )
    for ax in axes:
        _ticks(ax, ticks, tick_labels, small)
    _published_markers(published(exp), rows, xs, ax_e, ax_u)
    if len({str(r["case"]) for r in rows}) > 1:
        handles = [Patch(facecolor=colour[a], label=a) for a in colour]
        ax_p.legend(handles=handles, fontsize=6, ncol=min(len(colour), 4))


def _trade_off(exp: Experiment, rows: list[Row], ax: Axes, colour: dict[str, ColorType]) -> None:
    """Each row a point (mean exposure / R, utility) with both 95% CIs, labelled with
    its case when there are several; R a vertical line. A published point is a hollow
    star at the published exposure and utility (the row's own where one is not
    published), tied to the row by a dotted line."""
    v = view(exp)
    for i, (arm, c) in enumerate(colour.items()):
        mine = [r for r in rows if r["arm"] == arm]
        ax.errorbar(
            [_f(r, v.exposure) for r in mine],
            [_f(r, v.utility) for r in mine],
            xerr=[_f(r, v.exposure_ci) for r in mine],
            yerr=[_f(r, v.utility_ci) for r in mine],
            fmt=MARKERS[i % len(MARKERS)],
            markersize=4,
            c=c,
            label=arm,
            zorder=2,
        )
    if len({str(r["case"]) for r in rows}) > 1:
        for r in rows:
            where = (_f(r, v.exposure), _f(r, v.utility))
            ax.annotate(
                str(r["case"]), where, xytext=(3, 3), textcoords="offset points", fontsize=5
            )
    pubs, first = published(exp), True
    for r in rows:
        pub = pubs.get((str(r["case"]), str(r["arm"])))
        if pub is None:
            continue
        ours = (_f(r, v.exposure), _f(r, v.utility))
        theirs = (
            ours[0] if pub.exposure is None else pub.exposure,
            ours[1] if pub.utility is None else pub.utility,
        )
        ax.plot([ours[0], theirs[0]], [ours[1], theirs[1]], ":", c="grey", lw=1)
        ax.scatter(  # hollow: a published point on top of ours leaves ours visible
            [theirs[0]],
            [theirs[1]],
            marker="*",
            s=90,
            facecolors="none",
            edgecolors="red",
            zorder=3,
            label="published" if first else None,
            gid=PUBLISHED,
        )
        first = False
    ax.axvline(v.windows, color="red", linestyle="--", linewidth=1, label=_r_label(v))
    _log_if_wide(ax.set_xscale, [_f(r, v.exposure) for r in rows])
    ax.set_xlabel("realised exposure / R (mean, 95% CI)")
    ax.set_ylabel("utility (mean, 95% CI)")
    ax.set_title("utility vs exposure", fontsize=9)
    ax.legend(fontsize=6)


def ungated(exp: Experiment) -> set[tuple[str, str]]:
    """The (case, arm) rows with no gate beyond the per-call one (`Local`)."""
    return {(c.label, a) for c in exp.cases for a, spec in c.arms if isinstance(spec, Local)}


def _per_seed_panels(
    exp: Experiment,
    rows: list[Row],
    fig: Figure,
    slot: SubplotSpec,
    colour: dict[str, ColorType],
    small: int,
) -> None:
    """The per-seed boxes; an ungated arm (tens of R) on an axis of its own beside the
    gated ones (near R), whose boxes would otherwise collapse to lines."""
    free = ungated(exp)
    apart = [r for r in rows if (str(r["case"]), str(r["arm"])) in free]
    gated = [r for r in rows if (str(r["case"]), str(r["arm"])) not in free]
    if not apart or not gated:
        _per_seed(exp, rows, fig.add_subplot(slot), colour, small, "")
        return
    inner = slot.subgridspec(1, 2, width_ratios=(4, 1))
    _per_seed(exp, gated, fig.add_subplot(inner[0, 0]), colour, small, "gated arms")
    _per_seed(exp, apart, fig.add_subplot(inner[0, 1]), colour, small, UNGATED)


def _per_seed(
    exp: Experiment,
    rows: list[Row],
    ax: Axes,
    colour: dict[str, ColorType],
    small: int,
    which: str,
) -> None:
    """Rows' per-seed worst window / R (the last window's, in a last-window view), the
    figure R bounds, as boxes from their stored quantiles (box 25-75 %, whiskers 5-95 %,
    dots 0, 1, 99, 100 %), grouped by case, coloured by arm. Published exposure is a
    sum over windows, so its star is drawn for one-window cases only."""
    v = view(exp)
    arms = [a for a in colour if any(r["arm"] == a for r in rows)]
    positions, ticks, tick_labels = _place(rows, arms)
    stats, low = [], []
    for r in rows:
        qs = r[v.quantiles]
        assert isinstance(qs, list | tuple)
        q = dict(zip(EXPOSURE_Q, map(float, qs), strict=True))
        low.append(q[0])
        stats.append(
            {
                "med": q[50],
                "q1": q[25],
                "q3": q[75],
                "whislo": q[5],
                "whishi": q[95],
                "fliers": [q[0], q[1], q[99], q[100]],
            }
        )
    boxes = ax.bxp(
        stats,
        positions=positions,
        widths=0.7,
        patch_artist=True,
        flierprops={"marker": ".", "markersize": 3},
        medianprops={"color": "black"},
    )
    for box, r in zip(boxes["boxes"], rows, strict=True):
        box.set_facecolor(colour[str(r["arm"])])
        box.set_gid(f"{r['case']}|{r['arm']}")
    one_window = {c.label for c in exp.cases if c.scenario.model.windows == 1}
    at = {(str(r["case"]), str(r["arm"])): x for r, x in zip(rows, positions, strict=True)}
    shown = [
        (at[k], p.exposure)
        for k, p in published(exp).items()
        if k in at and k[0] in one_window and p.exposure is not None
    ]
    _star(ax, [x for x, _ in shown], [e for _, e in shown], None)
    ax.axhline(1.0, color="red", linestyle="--", linewidth=1)
    _log_if_wide(ax.set_yscale, [_f(r, v.exposure_max) for r in rows] + [min(low)])
    _ticks(ax, ticks, tick_labels, small)
    if len({str(r["case"]) for r in rows}) > 1:
        handles = [Patch(facecolor=colour[a], label=a) for a in arms]
        ax.legend(handles=handles, fontsize=6, ncol=min(len(arms), 4))
    window = "last" if exp.last_window else "worst"
    ax.set_ylabel(f"per-seed {window} window's exposure / R")
    if which == UNGATED:
        ax.set_title(UNGATED, fontsize=8)
        return
    ax.set_title(
        f"per seed, the {window} window's exposure / R: box 25-75 %, whiskers 5-95 %, "
        "dots 0/1/99/100 %, red star published (one window), dashed R"
        + (f"; {which}" if which else ""),
        fontsize=8 if which else 9,
    )
