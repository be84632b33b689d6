"""Output of an experiment: a terminal table, JSON, CSV and the figure (PNG, SVG, PDF)."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, is_dataclass
from pathlib import Path

from rich.table import Table

from sim.experiments import Experiment, Published
from sim.figure import figure
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


def _published(pub: Published | None) -> str:
    if pub is None:
        return ""
    return " / ".join("-" if x is None else f"{x:.3g}" for x in (pub.exposure, pub.utility))


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
        "published exp. / util.",
        "E[(S-R)+]/R",
        "utility ±95%",
        "pre/burst/post",
    ]
    if windows > 1:
        cols += ["last window: P(overdraw)", "max", "utility"]
    cols += ["denied", "escal.", "moved $"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("case", "arm") else "right")
    comparable = exp.comparable()
    for r in rows:
        pub = comparable.get((str(r["case"]), str(r["arm"])))
        cells = [
            str(r["case"]),
            str(r["arm"]),
            _opt(r, "settle_delay"),
            _opt(r, "approval_latency"),
            _wilson(r),
            f"{_f(r, 'exposure'):.3f} ±{_f(r, 'exposure_ci'):.3f}",
            f"{_f(r, 'exposure_max'):.2f}",
            _published(pub),
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
    """Per case and irrev arm: utility >=, P(overdraw) <= and the 99th percentile of
    the seeds' worst windows <= the published ledger's (point estimates; the
    intervals are in the rows: utility_ci, p_overdraw_lo/hi, worst_q99_lo/hi). Not the
    sample maximum, which turns on one seed."""
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
                "worst_q99": _f(r, "worst_q99") <= _f(ref, "worst_q99"),
            }
            out.append({"case": case, "arm": r["arm"], **checks, "holds": all(checks.values())})
    return out


def verdict_table(verdicts: list[Row]) -> Table:
    t = Table(title=f"Pareto against the published ledger ({PARETO_REFERENCE})")
    for col in ("case", "arm", "utility >=", "P(overdraw) <=", "q99 worst window <=", "all"):
        t.add_column(col)
    for v in verdicts:
        marks = ["yes" if v[k] else "NO" for k in ("utility", "p_overdraw", "worst_q99")]
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
    """The row with its quantiles as columns (worst_window_q0 ... worst_window_q100,
    exposure_last_q0 ...),
    so a spreadsheet reads numbers, not a bracketed list."""
    out = {k: v for k, v in row.items() if k not in ("worst_window_q", "exposure_last_q")}
    for key in ("worst_window_q", "exposure_last_q"):
        qs = row.get(key)
        if isinstance(qs, list | tuple):
            out |= {f"{key}{level}": q for level, q in zip(EXPOSURE_Q, qs, strict=True)}
    return out


def write(exp: Experiment, rows: list[Row], out: Path, meta: dict[str, object]) -> list[Path]:
    """JSON (meta: version, commit, seeds...; every case's parameters and seed block;
    rows, each with its per-seed worst-window quantiles at `worst_window_q_percents`; Pareto
    verdicts where there is a reference arm), CSV, and the figure as PNG, SVG and PDF."""
    out.mkdir(parents=True, exist_ok=True)
    js = out / f"{exp.name}.json"
    # only figures measured in the world the rows ran in: a published number beside a
    # mispriced or resized world's row would claim a comparison no one made
    published = [
        {"case": c, "arm": a, "exposure": p.exposure, "utility": p.utility}
        for (c, a), p in exp.comparable().items()
    ]
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


def _plot(exp: Experiment, rows: list[Row], stem: Path) -> list[Path]:
    fig = figure(exp, rows)
    paths = [stem.with_suffix(s) for s in (".png", ".svg", ".pdf")]
    fig.savefig(paths[0], dpi=120)
    for path in paths[1:]:
        fig.savefig(path)
    return paths
