"""Named experiments: cases (one CRN workload each) times arms.

Every arm of a case runs on the same workload, so differences between arms are paired.
Seed blocks follow the published artifact (E1 from seed 1000, E11 from 11000, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from sim import metrics, runner, workload
from sim.arms import Breaker, Budget, Cap, Local, Posthoc, Static, Toctou
from sim.irrev import Irrev
from sim.params import Attack, Model, ProductLine, Scenario, Spike
from sim.runner import Arm


class Spec(Protocol):
    def build(self, wl: workload.Workload) -> Arm: ...


Arms = tuple[tuple[str, Spec], ...]


@dataclass(frozen=True)
class Case:
    label: str
    scenario: Scenario
    arms: Arms
    seed0: int
    x: float = 0.0  # sweep coordinate, for plots


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    cases: tuple[Case, ...]
    x_label: str = ""
    published: dict[tuple[str, str], float] = field(default_factory=dict)  # exposure / R


IRREV: Arms = (("irrev", Irrev()), ("irrev-stressed", Irrev(stressed=True)))
E1_ARMS: Arms = (
    ("local", Local()),
    ("breaker-0", Breaker(0)),
    ("breaker-10", Breaker(10)),
    ("breaker-50", Breaker(50)),
    ("static", Static()),
    ("cap", Cap()),
    ("toctou-10", Toctou(10)),
    ("posthoc", Posthoc(0)),
    ("budget", Budget()),
    *IRREV,
)
BASIC: Arms = (("local", Local()), ("budget", Budget()), *IRREV)
FLEET_SIZES = (10, 50, 200, 1000)


def e1(agents: tuple[int, ...]) -> Experiment:
    cases = tuple(Case(f"N={n}", Scenario(Model(n_agents=n)), E1_ARMS, 1000, n) for n in agents)
    pub = {("N=50", "local"): 2.43, ("N=50", "budget"): 0.48, ("N=50", "cap"): 0.25}
    pub |= {("N=50", f"breaker-{d}"): e for d, e in ((0, 1.03), (10, 1.44), (50, 2.24))}
    return Experiment("e1", "E1: every gate side by side", cases, "agents", pub)


def fleet(agents: tuple[int, ...]) -> Experiment:
    cases = tuple(Case(f"N={n}", Scenario(Model(n_agents=n)), BASIC, 11000, n) for n in agents)
    pub = {
        (f"N={n}", "local"): e for n, e in zip(FLEET_SIZES, (0.48, 2.44, 9.70, 48.5), strict=True)
    }
    pub |= {
        (f"N={n}", "budget"): e for n, e in zip(FLEET_SIZES, (0.44, 0.48, 0.48, 0.49), strict=True)
    }
    return Experiment("fleet", "E11: fleet size", cases, "agents", pub)


def windows(agents: tuple[int, ...]) -> Experiment:
    """The published E5 `no_attack` row: three windows, the burst in the first."""
    sc = Scenario(Model(n_agents=agents[0], windows=3))
    pub = {("windows=3", "budget"): 315_809.38 / 250_000.0}
    cases = (Case("windows=3", sc, E1_ARMS, 5000, 3),)
    return Experiment("windows", "E5: three windows, every ledger renewing", cases, "", pub)


def attack(agents: tuple[int, ...]) -> Experiment:
    n = agents[0]
    honest = Scenario(Model(n_agents=n), Attack())
    lying = Scenario(Model(n_agents=n), Attack(declared_factor=0.226))
    cases = (Case("fragments", honest, BASIC, 1000), Case("misdeclared", lying, BASIC, 1000, 1))
    return Experiment("attack", "Fragmentation: $1.5M in $10k pieces", cases)


def budget_sweep(agents: tuple[int, ...]) -> Experiment:
    sc = Scenario(Model(n_agents=agents[0]))
    cases = (
        Case(f"B/R={b}", sc, (("budget", Budget(budget_frac=b)),), 2000, b)
        for b in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
    )
    return Experiment("budget", "E2: budget size B/R", tuple(cases), "B/R")


def misprice(agents: tuple[int, ...]) -> Experiment:
    sc = Scenario(Model(n_agents=agents[0]))
    cases = (
        Case(f"eps={e}", sc, (("budget", Budget(eps=e)),), 3000, e)
        for e in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)
    )
    return Experiment("misprice", "E3: charges scaled by eps", tuple(cases), "eps")


def correlated(agents: tuple[int, ...]) -> Experiment:
    sc = Scenario(Model(n_agents=agents[0], correlated=True))
    pub = {("corr", "budget"): 1.06, ("corr", "local"): 6.47}
    return Experiment("corr", "E8: correlated recovery", (Case("corr", sc, BASIC, 8000),), "", pub)


def breaker(agents: tuple[int, ...]) -> Experiment:
    sc = Scenario(Model(n_agents=agents[0]))
    cases = tuple(
        Case(f"lag={d}", sc, ((f"breaker-{d}", Breaker(d)),), 13500 + d, d) for d in (0, 10, 50)
    )
    pub = {(f"lag={d}", f"breaker-{d}"): e for d, e in ((0, 1.03), (10, 1.44), (50, 2.24))}
    return Experiment("breaker", "E13: reactive breaker", cases, "lag (ticks)", pub)


def toctou(agents: tuple[int, ...]) -> Experiment:
    sc = Scenario(Model(n_agents=agents[0]))
    cases = (Case(f"W={w}", sc, (("toctou", Toctou(w)),), 1000, w) for w in (1, 2, 5, 10, 25, 50))
    return Experiment("toctou", "Check-then-debit staleness W", tuple(cases), "W (ticks)")


def settle(agents: tuple[int, ...]) -> Experiment:
    sc = Scenario(Model(n_agents=agents[0]))
    cases = (
        Case(f"delay={d}", sc, (("irrev", Irrev(settle_delay=d)),), 1000, d)
        for d in (1, 5, 10, 20, 50, 100, 200)
    )
    return Experiment("settle", "irrev: settlement delay", tuple(cases), "delay (ticks)")


def spike(agents: tuple[int, ...]) -> Experiment:
    lines = (
        ProductLine(),
        ProductLine(value_mu=10.2, value_sigma=0.4, recovery_a=4.0, recovery_b=2.0, supplier=1),
        ProductLine(value_mu=9.0, value_sigma=0.6, recovery_a=9.0, recovery_b=1.5, supplier=2),
    )
    model = Model(n_agents=agents[0], lines=lines, spike=Spike(), p_comp_fail=0.0)
    arms = (*BASIC, ("irrev-supplier", Irrev(stressed=True, supplier_limit_frac=0.5)))
    return Experiment(
        "spike",
        "Product lines + supplier price spike",
        (Case("spike", Scenario(model), arms, 1000),),
    )


EXPERIMENTS: dict[str, Callable[[tuple[int, ...]], Experiment]] = {
    "e1": e1,
    "fleet": fleet,
    "windows": windows,
    "attack": attack,
    "budget": budget_sweep,
    "misprice": misprice,
    "corr": correlated,
    "breaker": breaker,
    "toctou": toctou,
    "settle": settle,
    "spike": spike,
}
DEFAULT_AGENTS: dict[str, tuple[int, ...]] = {"fleet": FLEET_SIZES}


def run_case(
    case: Case, seeds: int, on_arm: Callable[[], None] = lambda: None
) -> list[dict[str, object]]:
    wl = workload.build(case.scenario, range(case.seed0, case.seed0 + seeds))
    rows: list[dict[str, object]] = []
    for label, spec in case.arms:
        summary = metrics.summarize(metrics.per_seed(wl, runner.run(spec.build(wl), wl)))
        rows.append({"case": case.label, "x": case.x, "arm": label, **asdict(summary)})
        on_arm()
    return rows
