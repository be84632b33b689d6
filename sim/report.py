"""Output of an experiment: a terminal table, JSON, CSV and the figure (PNG, SVG, PDF)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import Patch
from matplotlib.typing import ColorType
from rich.table import Table

from sim.experiments import Experiment
from sim.metrics import EXPOSURE_Q

Row = dict[str, object]


def _f(row: Row, key: str) -> float:
    value = row[key]
    assert isinstance(value, int | float)
    return float(value)


def _wilson(r: Row, key: str = "p_overdraw") -> str:
    n = int(_f(r, "seeds"))
    k = round(_f(r, key) * n)
    return f"{k}/{n} = {_f(r, key):.4f} [{_f(r, key + '_lo'):.4f},{_f(r, key + '_hi'):.4f}]"


def _opt(r: Row, key: str) -> str:
    value = r.get(key)
    return "-" if value is None else str(value)


def table(exp: Experiment, rows: list[Row]) -> Table:
    """Every row: the rate with its interval and sample, severity, utility with CI, and
    the settlement delay d and approval latency L it ran with ('-': the arm has none)."""
    windows = max(c.scenario.model.windows for c in exp.cases)
    t = Table(title=f"{exp.title} ({_f(rows[0], 'seeds'):.0f} seeds per case)")
    cols = [
        "case",
        "arm",
        "d",
        "L",
        "P(overdraw) [95% Wilson]",
        "exposure/R ±95%",
        "max",
        "published",
        "E[(S-R)+]/R",
        "utility ±95%",
        "pre/burst/post",
    ]
    if windows > 1:
        cols += ["last window: P(overdraw)", "max", "utility"]
    cols += ["denied", "escal.", "moved $"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("case", "arm") else "right")
    for r in rows:
        pub = exp.published.get((str(r["case"]), str(r["arm"])))
        cells = [
            str(r["case"]),
            str(r["arm"]),
            _opt(r, "settle_delay"),
            _opt(r, "approval_latency"),
            _wilson(r),
            f"{_f(r, 'exposure'):.3f} ±{_f(r, 'exposure_ci'):.3f}",
            f"{_f(r, 'exposure_max'):.2f}",
            "" if pub is None else f"{pub:.2f}",
            f"{_f(r, 'shortfall'):.4f}",
            f"{_f(r, 'utility'):.3f} ±{_f(r, 'utility_ci'):.3f}",
            f"{_f(r, 'util_pre'):.2f}/{_f(r, 'util_burst'):.2f}/{_f(r, 'util_post'):.3f}",
        ]
        if windows > 1:
            cells += [
                _wilson(r, "p_overdraw_last"),
                f"{_f(r, 'exposure_last_max'):.2f}",
                f"{_f(r, 'util_last'):.3f} ±{_f(r, 'util_last_ci'):.3f}",
            ]
        cells += [
            f"{_f(r, 'denied'):.1f}",
            f"{_f(r, 'escalated'):.1f}",
            f"{_f(r, 'moved'):,.0f}",
        ]
        t.add_row(*cells)
    return t


PARETO_REFERENCE = "budget"


def pareto_verdicts(rows: list[Row], reference: str = PARETO_REFERENCE) -> list[Row]:
    """Per case and irrev arm: utility >=, P(overdraw) <= and max exposure <= the
    published ledger's (point estimates; the intervals are in the main table)."""
    out: list[Row] = []
    for case in dict.fromkeys(str(r["case"]) for r in rows):
        mine = [r for r in rows if r["case"] == case]
        ref = next((r for r in mine if r["arm"] == reference), None)
        if ref is None:
            continue
        for r in mine:
            if not str(r["arm"]).startswith("irrev"):
                continue
            checks = {
                "utility": _f(r, "utility") >= _f(ref, "utility"),
                "p_overdraw": _f(r, "p_overdraw") <= _f(ref, "p_overdraw"),
                "exposure_max": _f(r, "exposure_max") <= _f(ref, "exposure_max"),
            }
            out.append({"case": case, "arm": r["arm"], **checks, "holds": all(checks.values())})
    return out


def verdict_table(verdicts: list[Row]) -> Table:
    t = Table(title=f"Pareto against the published ledger ({PARETO_REFERENCE})")
    for col in ("case", "arm", "utility >=", "P(overdraw) <=", "max exposure <=", "all"):
        t.add_column(col)
    for v in verdicts:
        marks = ["yes" if v[k] else "NO" for k in ("utility", "p_overdraw", "exposure_max")]
        t.add_row(str(v["case"]), str(v["arm"]), *marks, "yes" if v["holds"] else "NO")
    return t


def parameters(exp: Experiment) -> list[dict[str, object]]:
    """Every case's world, attack, seed block and arm specs, as JSON-ready dicts."""
    return [
        {
            "case": c.label,
            "seed0": c.seed0,
            "scenario": asdict(c.scenario),
            "arms": {label: _spec(spec) for label, spec in c.arms},
        }
        for c in exp.cases
    ]


def _spec(spec: object) -> dict[str, object]:
    fields = asdict(spec) if is_dataclass(spec) and not isinstance(spec, type) else {}
    return {"type": type(spec).__name__, **fields}


def _csv_row(row: Row) -> Row:
    """The row with its quantiles as columns (worst_window_q0 ... worst_window_q100),
    so a spreadsheet reads numbers, not a bracketed list."""
    out = {k: v for k, v in row.items() if k != "worst_window_q"}
    qs = row.get("worst_window_q")
    if isinstance(qs, list | tuple):
        out |= {f"worst_window_q{level}": q for level, q in zip(EXPOSURE_Q, qs, strict=True)}
    return out


def write(exp: Experiment, rows: list[Row], out: Path, meta: dict[str, object]) -> list[Path]:
    """JSON (meta: version, commit, seeds...; every case's parameters and seed block;
    rows, each with its per-seed worst-window quantiles at `worst_window_q_percents`; Pareto
    verdicts where there is a reference arm), CSV, and the figure as PNG, SVG and PDF."""
    out.mkdir(parents=True, exist_ok=True)
    js = out / f"{exp.name}.json"
    published = [{"case": c, "arm": a, "exposure": e} for (c, a), e in exp.published.items()]
    doc = {
        **meta,
        "parameters": parameters(exp),
        "published": published,
        "worst_window_q_percents": list(EXPOSURE_Q),
        "rows": rows,
        "pareto": pareto_verdicts(rows),
    }
    js.write_text(json.dumps(doc, indent=2))
    cs = out / f"{exp.name}.csv"
    flat = [_csv_row(r) for r in rows]
    with cs.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(flat[0]))
        writer.writeheader()
        writer.writerows(flat)
    return [js, cs, *_plot(exp, rows, out / exp.name)]


MARKERS = "os^Dv<>PXh"


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


def _ceiling(exp: Experiment) -> float:
    """Where the dashed line goes on a mean-exposure axis: exposure sums over windows
    and R bounds each, so W windows that all stay within R sum to at most W R."""
    return float(max(c.scenario.model.windows for c in exp.cases))


def _r_label(exp: Experiment) -> str:
    w = _ceiling(exp)
    return "R" if w == 1 else f"{w:g} R ({w:g} windows, each within R)"


def _arm_colours(arms: list[str]) -> dict[str, ColorType]:
    # one colour per arm in every panel, so the legend of one panel reads them all
    cmap = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20")
    return {arm: cmap(i % cmap.N) for i, arm in enumerate(arms)}


def _plot(exp: Experiment, rows: list[Row], stem: Path) -> list[Path]:
    """Top: P(overdraw), exposure, utility per case and arm. Bottom: the trade-off
    (utility against exposure) and every row's per-seed exposure distribution."""
    fig = plt.figure(figsize=(18, 10))
    grid = fig.add_gridspec(2, 3)
    ax_p, ax_e, ax_u = (fig.add_subplot(grid[0, i]) for i in range(3))
    ax_t = fig.add_subplot(grid[1, 0])
    ax_d = fig.add_subplot(grid[1, 1:])
    cases = list(dict.fromkeys(str(r["case"]) for r in rows))
    arms = list(dict.fromkeys(str(r["arm"]) for r in rows))
    colour = _arm_colours(arms)
    small = 6 if len(rows) > 20 else 8
    sweep = len(cases) > 1 and bool(exp.x_label)
    if sweep:
        _sweep_lines(exp, rows, colour, (ax_p, ax_e, ax_u))
    else:
        _case_bars(exp, rows, colour, (ax_p, ax_e, ax_u), small)
    _log_if_wide(ax_e.set_yscale, [_f(r, k) for r in rows for k in ("exposure", "exposure_max")])
    _trade_off(exp, rows, ax_t, colour)
    _per_seed(exp, rows, ax_d, colour, small)
    ax_e.axhline(_ceiling(exp), color="red", linestyle="--", linewidth=1, label=_r_label(exp))
    ax_p.set_ylabel("P(overdraw), 95% Wilson interval")
    worst = "dotted" if sweep else "tick"
    ax_e.set_ylabel(f"exposure / R (mean, 95% CI; {worst}: worst window)")
    ax_u.set_ylabel("utility (executed / proposed value)")
    ax_e.legend(fontsize=7)
    if sweep:
        ax_p.legend(fontsize=7)
    seeds = int(_f(rows[0], "seeds"))
    fig.suptitle(f"{exp.title} ({seeds} seeds per case)")
    fig.tight_layout()
    paths = [stem.with_suffix(s) for s in (".png", ".svg", ".pdf")]
    fig.savefig(paths[0], dpi=120)
    for path in paths[1:]:
        fig.savefig(path)
    plt.close(fig)
    return paths


def _wilson_err(rows: list[Row]) -> list[list[float]]:
    # clipped: at 0 or n of n, the Wilson bound and the rate differ by rounding only
    return [
        [max(0.0, _f(r, "p_overdraw") - _f(r, "p_overdraw_lo")) for r in rows],
        [max(0.0, _f(r, "p_overdraw_hi") - _f(r, "p_overdraw")) for r in rows],
    ]


def _sweep_lines(
    exp: Experiment, rows: list[Row], colour: dict[str, ColorType], axes: tuple[Axes, Axes, Axes]
) -> None:
    """A sweep's top panels: P(overdraw), exposure (and its worst window, dotted) and
    utility against the swept x, a line per arm."""
    ax_p, ax_e, ax_u = axes
    for arm in colour:
        mine = [r for r in rows if r["arm"] == arm]
        xs = [_f(r, "x") for r in mine]
        panels = (
            (ax_p, "p_overdraw", _wilson_err(mine)),
            (ax_e, "exposure", [_f(r, "exposure_ci") for r in mine]),
            (ax_u, "utility", [_f(r, "utility_ci") for r in mine]),
        )
        for ax, key, err in panels:
            ax.errorbar(
                xs, [_f(r, key) for r in mine], yerr=err, marker="o", label=arm, c=colour[arm]
            )
        ax_e.plot(xs, [_f(r, "exposure_max") for r in mine], linestyle=":", c=colour[arm])
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
    tick), the published exposures as red stars, and a legend of the arms' colours
    when there is more than one case."""
    ax_p, ax_e, ax_u = axes
    xs, ticks, tick_labels = _place(rows, list(colour))
    colours = [colour[str(r["arm"])] for r in rows]
    ax_p.bar(xs, [_f(r, "p_overdraw") for r in rows], yerr=_wilson_err(rows), color=colours)
    ax_e.bar(
        xs,
        [_f(r, "exposure") for r in rows],
        yerr=[_f(r, "exposure_ci") for r in rows],
        color=colours,
    )
    ax_e.scatter(xs, [_f(r, "exposure_max") for r in rows], marker="_", color="black")
    ax_u.bar(
        xs,
        [_f(r, "utility") for r in rows],
        yerr=[_f(r, "utility_ci") for r in rows],
        color=colours,
    )
    for ax in axes:
        _ticks(ax, ticks, tick_labels, small)
    at = {(str(r["case"]), str(r["arm"])): x for r, x in zip(rows, xs, strict=True)}
    shown = [(at[k], e) for k, e in exp.published.items() if k in at]
    for i, (x, exposure) in enumerate(shown):
        ax_e.scatter(
            [x],
            [exposure],
            marker="*",
            color="red",
            zorder=3,
            label="published" if i == 0 else None,
        )
    if len({str(r["case"]) for r in rows}) > 1:
        handles = [Patch(facecolor=colour[a], label=a) for a in colour]
        ax_p.legend(handles=handles, fontsize=6, ncol=min(len(colour), 4))


def _trade_off(exp: Experiment, rows: list[Row], ax: Axes, colour: dict[str, ColorType]) -> None:
    """Each row a point (mean exposure / R, utility) with both 95% CIs; R a vertical
    line. Only exposure is published, so a published point sits at the published
    exposure and the row's own utility, tied to the row by a dotted line."""
    for i, (arm, c) in enumerate(colour.items()):
        mine = [r for r in rows if r["arm"] == arm]
        ax.errorbar(
            [_f(r, "exposure") for r in mine],
            [_f(r, "utility") for r in mine],
            xerr=[_f(r, "exposure_ci") for r in mine],
            yerr=[_f(r, "utility_ci") for r in mine],
            fmt=MARKERS[i % len(MARKERS)],
            markersize=4,
            c=c,
            label=arm,
            zorder=2,
        )
    first = True
    for r in rows:
        pub = exp.published.get((str(r["case"]), str(r["arm"])))
        if pub is None:
            continue
        ax.plot([_f(r, "exposure"), pub], [_f(r, "utility")] * 2, ":", c="grey", lw=1)
        ax.scatter(  # hollow: a published point on top of ours leaves ours visible
            [pub],
            [_f(r, "utility")],
            marker="*",
            s=90,
            facecolors="none",
            edgecolors="red",
            zorder=3,
            label="published exposure (at our utility)" if first else None,
        )
        first = False
    ax.axvline(_ceiling(exp), color="red", linestyle="--", linewidth=1, label=_r_label(exp))
    _log_if_wide(ax.set_xscale, [_f(r, "exposure") for r in rows])
    ax.set_xlabel("realised exposure / R (mean, 95% CI)")
    ax.set_ylabel("utility (mean, 95% CI)")
    ax.set_title("utility vs exposure", fontsize=9)
    ax.legend(fontsize=6)


def _per_seed(
    exp: Experiment, rows: list[Row], ax: Axes, colour: dict[str, ColorType], small: int
) -> None:
    """Every row's per-seed worst window / R, the figure R bounds, as a box drawn from
    its stored quantiles (box 25-75 %, whiskers 5-95 %, dots 0, 1, 99, 100 %), grouped by
    case, coloured by arm: the tail the mean and max alone hide. Published exposure is a
    sum over windows, so its star is drawn for one-window cases only."""
    cases = list(dict.fromkeys(str(r["case"]) for r in rows))
    arms = list(colour)
    positions, ticks, tick_labels = _place(rows, arms)
    stats, colours, low = [], [], []
    for r in rows:
        qs = r["worst_window_q"]
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
        colours.append(colour[str(r["arm"])])
    boxes = ax.bxp(
        stats,
        positions=positions,
        widths=0.7,
        patch_artist=True,
        flierprops={"marker": ".", "markersize": 3},
        medianprops={"color": "black"},
    )
    for box, c in zip(boxes["boxes"], colours, strict=True):
        box.set_facecolor(c)
    one_window = {c.label for c in exp.cases if c.scenario.model.windows == 1}
    at = {(str(r["case"]), str(r["arm"])): x for r, x in zip(rows, positions, strict=True)}
    for (case, arm), exposure in exp.published.items():
        if (case, arm) in at and case in one_window:
            ax.scatter([at[case, arm]], [exposure], marker="*", color="red", zorder=3)
    ax.axhline(1.0, color="red", linestyle="--", linewidth=1)
    _log_if_wide(ax.set_yscale, [_f(r, "exposure_max") for r in rows] + [min(low)])
    _ticks(ax, ticks, tick_labels, small)
    if len(cases) > 1:
        handles = [Patch(facecolor=colour[a], label=a) for a in arms]
        ax.legend(handles=handles, fontsize=6, ncol=min(len(arms), 4))
    ax.set_ylabel("per-seed worst window's exposure / R")
    ax.set_title(
        "per seed, the worst window's exposure / R: box 25-75 %, whiskers 5-95 %, "
        "dots 0/1/99/100 %, red star published (one window), dashed R",
        fontsize=9,
    )
