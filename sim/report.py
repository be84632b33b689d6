"""Output of an experiment: a terminal table, JSON, CSV and PNG plots."""

from __future__ import annotations

import csv
import json
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


def _wilson(r: Row) -> str:
    return f"{_f(r, 'p_overdraw'):.3f} [{_f(r, 'p_overdraw_lo'):.3f},{_f(r, 'p_overdraw_hi'):.3f}]"


def table(exp: Experiment, rows: list[Row]) -> Table:
    t = Table(title=f"{exp.title} ({_f(rows[0], 'seeds'):.0f} seeds)")
    for col in (
        "case",
        "arm",
        "P(overdraw) [95%]",
        "exposure/R ±95%",
        "p95",
        "published",
        "E[(S-R)+]/R",
        "utility",
        "pre/burst/post",
        "denied",
        "escal.",
        "moved $",
    ):
        t.add_column(col, justify="left" if col in ("case", "arm") else "right")
    for r in rows:
        pub = exp.published.get((str(r["case"]), str(r["arm"])))
        t.add_row(
            str(r["case"]),
            str(r["arm"]),
            _wilson(r),
            f"{_f(r, 'exposure'):.3f} ±{_f(r, 'exposure_ci'):.3f}",
            f"{_f(r, 'exposure_p95'):.2f}",
            "" if pub is None else f"{pub:.2f}",
            f"{_f(r, 'shortfall'):.3f}",
            f"{_f(r, 'utility'):.3f}",
            f"{_f(r, 'util_pre'):.2f}/{_f(r, 'util_burst'):.2f}/{_f(r, 'util_post'):.3f}",
            f"{_f(r, 'denied'):.1f}",
            f"{_f(r, 'escalated'):.1f}",
            f"{_f(r, 'moved'):,.0f}",
        )
    return t


def write(exp: Experiment, rows: list[Row], out: Path, meta: dict[str, object]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    js = out / f"{exp.name}.json"
    published = [{"case": c, "arm": a, "exposure": e} for (c, a), e in exp.published.items()]
    js.write_text(json.dumps({**meta, "published": published, "rows": rows}, indent=2))
    cs = out / f"{exp.name}.csv"
    with cs.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return [js, cs, _plot(exp, rows, out / f"{exp.name}.png")]


def _plot(exp: Experiment, rows: list[Row], path: Path) -> Path:
    fig, (ax_e, ax_u) = plt.subplots(1, 2, figsize=(12, 4.5))
    cases = list(dict.fromkeys(str(r["case"]) for r in rows))
    arms = list(dict.fromkeys(str(r["arm"]) for r in rows))
    if len(cases) > 1 and exp.x_label:
        for arm in arms:
            mine = [r for r in rows if r["arm"] == arm]
            xs = [_f(r, "x") for r in mine]
            ax_e.errorbar(
                xs,
                [_f(r, "exposure") for r in mine],
                yerr=[_f(r, "exposure_ci") for r in mine],
                marker="o",
                label=arm,
            )
            ax_u.plot(xs, [_f(r, "utility") for r in mine], marker="o", label=arm)
        for ax in (ax_e, ax_u):
            ax.set_xlabel(exp.x_label)
            if exp.x_label == "agents":
                ax.set_xscale("log")
    else:
        labels = [f"{r['arm']}" if len(cases) == 1 else f"{r['case']}\n{r['arm']}" for r in rows]
        ax_e.bar(
            labels, [_f(r, "exposure") for r in rows], yerr=[_f(r, "exposure_ci") for r in rows]
        )
        ax_u.bar(labels, [_f(r, "utility") for r in rows])
        for ax in (ax_e, ax_u):
            ax.tick_params(axis="x", rotation=60)
    ax_e.axhline(1.0, color="red", linestyle="--", linewidth=1, label="R")
    ax_e.set_ylabel("realised exposure / R (mean, 95% CI)")
    ax_u.set_ylabel("utility (executed / proposed value)")
    ax_e.legend(fontsize=7)
    fig.suptitle(exp.title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
