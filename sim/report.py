"""Output of an experiment: a terminal table, JSON, CSV and PNG plots."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, is_dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.table import Table

from sim.experiments import Experiment

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


def write(exp: Experiment, rows: list[Row], out: Path, meta: dict[str, object]) -> list[Path]:
    """JSON (meta: version, commit, seeds...; every case's parameters and seed block;
    rows; Pareto verdicts where there is a reference arm), CSV, and the figure as PNG
    and SVG."""
    out.mkdir(parents=True, exist_ok=True)
    js = out / f"{exp.name}.json"
    published = [{"case": c, "arm": a, "exposure": e} for (c, a), e in exp.published.items()]
    doc = {
        **meta,
        "parameters": parameters(exp),
        "published": published,
        "rows": rows,
        "pareto": pareto_verdicts(rows),
    }
    js.write_text(json.dumps(doc, indent=2))
    cs = out / f"{exp.name}.csv"
    with cs.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return [js, cs, *_plot(exp, rows, out / exp.name)]


def _plot(exp: Experiment, rows: list[Row], stem: Path) -> list[Path]:
    fig, (ax_p, ax_e, ax_u) = plt.subplots(1, 3, figsize=(17, 4.8))
    cases = list(dict.fromkeys(str(r["case"]) for r in rows))
    arms = list(dict.fromkeys(str(r["arm"]) for r in rows))

    def wilson_err(mine: list[Row]) -> list[list[float]]:
        # clipped: at 0 or n of n, the Wilson bound and the rate differ by rounding only
        return [
            [max(0.0, _f(r, "p_overdraw") - _f(r, "p_overdraw_lo")) for r in mine],
            [max(0.0, _f(r, "p_overdraw_hi") - _f(r, "p_overdraw")) for r in mine],
        ]

    if len(cases) > 1 and exp.x_label:
        for arm in arms:
            mine = [r for r in rows if r["arm"] == arm]
            xs = [_f(r, "x") for r in mine]
            panels = (
                (ax_p, "p_overdraw", wilson_err(mine)),
                (ax_e, "exposure", [_f(r, "exposure_ci") for r in mine]),
                (ax_u, "utility", [_f(r, "utility_ci") for r in mine]),
            )
            for ax, key, err in panels:
                ax.errorbar(xs, [_f(r, key) for r in mine], yerr=err, marker="o", label=arm)
            ax_e.plot(xs, [_f(r, "exposure_max") for r in mine], linestyle=":", color="grey")
        for ax in (ax_p, ax_e, ax_u):
            ax.set_xlabel(exp.x_label)
            if exp.x_label == "agents":
                ax.set_xscale("log")
    else:
        labels = [f"{r['arm']}" if len(cases) == 1 else f"{r['case']}\n{r['arm']}" for r in rows]
        ax_p.bar(labels, [_f(r, "p_overdraw") for r in rows], yerr=wilson_err(rows))
        ax_e.bar(
            labels, [_f(r, "exposure") for r in rows], yerr=[_f(r, "exposure_ci") for r in rows]
        )
        ax_e.scatter(labels, [_f(r, "exposure_max") for r in rows], marker="_", color="black")
        ax_u.bar(labels, [_f(r, "utility") for r in rows], yerr=[_f(r, "utility_ci") for r in rows])
        for ax in (ax_p, ax_e, ax_u):
            ax.tick_params(axis="x", rotation=60, labelsize=6 if len(rows) > 20 else 9)
    for (case, arm), exposure in exp.published.items():
        if case in cases and arm in arms and not (len(cases) > 1 and exp.x_label):
            ax_e.scatter(
                [arm if len(cases) == 1 else f"{case}\n{arm}"],
                [exposure],
                marker="*",
                color="red",
                zorder=3,
                label="published" if ax_e.get_legend() is None else None,
            )
    ax_e.axhline(1.0, color="red", linestyle="--", linewidth=1, label="R")
    ax_p.set_ylabel("P(overdraw), 95% Wilson interval")
    ax_e.set_ylabel("realised exposure / R (mean, 95% CI; max dotted)")
    ax_u.set_ylabel("utility (executed / proposed value)")
    ax_e.legend(fontsize=7)
    if len(cases) > 1 and exp.x_label:
        ax_p.legend(fontsize=7)
    seeds = int(_f(rows[0], "seeds"))
    fig.suptitle(f"{exp.title} ({seeds} seeds per case)")
    fig.tight_layout()
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=120)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths
