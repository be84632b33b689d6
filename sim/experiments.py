"""Named experiments: cases (one CRN workload each) times arms.

Every arm of a case runs on the same workload, so differences between arms are paired.
Seed blocks follow the published artifact (E1 from seed 1000, E11 from 11000, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Protocol, cast

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
class Published:
    """The artifact's mean figures (summary.csv, 300 seeds) for one arm in one world.
    They are comparable only to a row whose case has this scenario and whose arm is
    this spec: a figure drawn beside another world's row claims what no one measured."""

    scenario: Scenario
    arm: Spec
    exposure: float | None = None  # / R, summed over windows
    utility: float | None = None


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    cases: tuple[Case, ...]
    x_label: str = ""
    published: dict[tuple[str, str], Published] = field(default_factory=dict)
    # the figure shows the last window alone (what a multi-window claim is about)
    last_window: bool = False

    def comparable(self) -> dict[tuple[str, str], Published]:
        """The published figures of the rows run in the world they were measured in."""
        out = {}
        for c in self.cases:
            for label, spec in c.arms:
                pub = self.published.get((c.label, label))
                if pub is not None and pub.scenario == c.scenario and pub.arm == spec:
                    out[c.label, label] = pub
        return out


Figures = dict[str, tuple[float | None, float | None]]


def _published(
    case: str, scenario: Scenario, arms: Arms, figures: Figures
) -> dict[tuple[str, str], Published]:
    """`figures`: arm -> (exposure, utility) as published for `case` in `scenario`."""
    spec = dict(arms)
    return {(case, a): Published(scenario, spec[a], e, u) for a, (e, u) in figures.items()}


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
    figures: Figures = {"local": (2.43, 1.00), "budget": (0.48, 0.1996), "cap": (0.25, 0.10)}
    figures |= {f"breaker-{d}": (e, None) for d, e in ((0, 1.03), (10, 1.44), (50, 2.24))}
    pub = _published("N=50", Scenario(Model(n_agents=50)), E1_ARMS, figures)
    return Experiment("e1", "E1: every gate side by side", cases, "agents", pub)


def fleet(agents: tuple[int, ...]) -> Experiment:
    cases = tuple(Case(f"N={n}", Scenario(Model(n_agents=n)), BASIC, 11000, n) for n in agents)
    pub: dict[tuple[str, str], Published] = {}
    local = (0.48, 2.44, 9.70, 48.5)
    budget = ((0.44, 0.92), (0.48, 0.20), (0.48, 0.049), (0.489, 0.0099))
    for n, e, b in zip(FLEET_SIZES, local, budget, strict=True):
        figures: Figures = {"local": (e, 1.0), "budget": b}
        pub |= _published(f"N={n}", Scenario(Model(n_agents=n)), BASIC, figures)
    return Experiment("fleet", "E11: fleet size", cases, "agents", pub)


def windows(agents: tuple[int, ...]) -> Experiment:
    """The published E5 `no_attack` row: three windows, the burst in the first."""
    sc = Scenario(Model(n_agents=agents[0], windows=3))
    figures: Figures = {"budget": (315_809.38 / 250_000.0, 0.390)}
    pub = _published("windows=3", Scenario(Model(windows=3)), E1_ARMS, figures)
    cases = (Case("windows=3", sc, E1_ARMS, 5000, 3),)
    return Experiment("windows", "E5: three windows, every ledger renewing", cases, "", pub)


def reauth(agents: tuple[int, ...]) -> Experiment:
    """The published E6: humans approve denied effects, H per window (seeds 6000-)."""
    sc = Scenario(Model(n_agents=agents[0]))
    arms: Arms = (
        *((f"budget-h{h}", Budget(approvals=h)) for h in (0, 10, 50)),
        ("irrev", Irrev()),
        ("irrev-h0", Irrev(approvals=0)),
    )
    figures: Figures = {"budget-h10": (None, 0.233), "budget-h50": (None, 0.327)}
    pub = _published("E6", Scenario(Model()), arms, figures)
    cases = (Case("E6", sc, arms, 6000),)
    return Experiment("reauth", "E6: re-authorisation by humans", cases, published=pub)


def fairshare(agents: tuple[int, ...]) -> Experiment:
    """The published E9: a per-agent share against 10 colluders (seeds 9000-)."""
    sc = Scenario(Model(n_agents=agents[0]), Attack())
    arms: Arms = (
        ("budget", Budget()),
        ("budget-fair", Budget(fair_share=0.05)),
        ("irrev", Irrev()),
        ("irrev-fair", Irrev(agent_limit_frac=0.05)),
    )
    pub = _published("E9", Scenario(Model(), Attack()), arms, {"budget-fair": (None, 0.117)})
    cases = (Case("E9", sc, arms, 9000),)
    return Experiment("fairshare", "E9: fair share against colluders", cases, published=pub)


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
    arms: Arms = (("budget", Budget(budget_frac=2.0)),)
    pub = _published("B/R=2.0", Scenario(Model()), arms, {"budget": (0.96, 0.40)})
    return Experiment("budget", "E2: budget size B/R", tuple(cases), "B/R", pub)


def misprice(agents: tuple[int, ...]) -> Experiment:
    sc = Scenario(Model(n_agents=agents[0]))
    cases = (
        Case(f"eps={e}", sc, (("budget", Budget(eps=e)),), 3000, e)
        for e in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)
    )
    pub: dict[tuple[str, str], Published] = {}
    for e, figures in ((0.5, (0.96, 0.40)), (0.25, (1.93, 0.81))):
        arms: Arms = (("budget", Budget(eps=e)),)
        pub |= _published(f"eps={e}", Scenario(Model()), arms, {"budget": figures})
    return Experiment("misprice", "E3: charges scaled by eps", tuple(cases), "eps", pub)


def correlated(agents: tuple[int, ...]) -> Experiment:
    """The published E8 (seeds 8000-): burst-time recovery Beta(2, 6), with the
    published perfect stress arm beside the basic ones."""
    sc = Scenario(Model(n_agents=agents[0], correlated=True))
    arms: Arms = (*BASIC, ("budget-stress", Budget(stress=True)))
    figures: Figures = {
        "budget": (1.06, 0.20),
        "local": (6.47, 1.00),
        "budget-stress": (0.6665, 0.1458),
    }
    pub = _published("corr", Scenario(Model(correlated=True)), arms, figures)
    return Experiment("corr", "E8: correlated recovery", (Case("corr", sc, arms, 8000),), "", pub)


def breaker(agents: tuple[int, ...]) -> Experiment:
    sc = Scenario(Model(n_agents=agents[0]))
    cases = tuple(
        Case(f"lag={d}", sc, ((f"breaker-{d}", Breaker(d)),), 13500 + d, d) for d in (0, 10, 50)
    )
    pub: dict[tuple[str, str], Published] = {}
    for d, e in ((0, 1.03), (10, 1.44), (50, 2.24)):
        arms: Arms = ((f"breaker-{d}", Breaker(d)),)
        pub |= _published(f"lag={d}", Scenario(Model()), arms, {f"breaker-{d}": (e, None)})
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


PARETO_DELAYS = (0, 5, 20, 50, 200, 1000)
PARETO_MISPRICES = (1.0, 1.5, 2.0, 3.0)
PARETO_LATENCIES = (0, 50)
PARETO_SEED0 = 200_000  # fresh: no arm was tuned on this block


def pareto_arms(delay: int, latency: int) -> Arms:
    """The published ledger, alone and with its E6 humans, against irrev and irrev with
    self-calibrating prices, all with the same humans (50 approvals per window)."""
    return (
        ("budget", Budget()),
        ("budget-h50", Budget(approvals=50, approval_latency=latency)),
        ("irrev", Irrev(settle_delay=delay, approval_latency=latency)),
        ("irrev-cal", Irrev(settle_delay=delay, approval_latency=latency, calibrate=True)),
    )


def pareto(
    agents: tuple[int, ...],
    delays: tuple[int, ...] = PARETO_DELAYS,
    misprices: tuple[float, ...] = PARETO_MISPRICES,
    latencies: tuple[int, ...] = PARETO_LATENCIES,
) -> Experiment:
    """Issue 15's grid: settlement delay d x mispricing k x approval latency."""
    cases = tuple(
        Case(
            f"d={d} k={k:g} L={lat}",
            Scenario(Model(n_agents=agents[0], misprice=k)),
            pareto_arms(d, lat),
            PARETO_SEED0,
            d,
        )
        for lat in latencies
        for k in misprices
        for d in delays
    )
    return Experiment("pareto", "Pareto: settlement delay x mispricing x approval latency", cases)


def calibration(
    agents: tuple[int, ...], misprices: tuple[float, ...] = PARETO_MISPRICES
) -> Experiment:
    """A mispriced world over two windows: what settled evidence teaches by window 2."""
    cases = tuple(
        Case(
            f"k={k:g}",
            Scenario(Model(n_agents=agents[0], misprice=k, windows=2)),
            (("budget", Budget()), ("irrev", Irrev()), ("irrev-cal", Irrev(calibrate=True))),
            PARETO_SEED0,
            k,
        )
        for k in misprices
    )
    title = "Self-calibration: window 2 of a k x world"
    return Experiment("calibration", title, cases, "k", last_window=True)


@dataclass(frozen=True, kw_only=True)
class World:
    """Overrides of the world and of the arms' knobs for every case of an experiment;
    None keeps what the experiment says. An arm knob reaches every arm that has it."""

    misprice: float | None = None
    misprice_shape: str | None = None
    windows: int | None = None
    p_burst: float | None = None
    burst_len: int | None = None
    correlated: bool | None = None
    settle_delay: int | None = None
    approval_latency: int | None = None
    escalation_ttl: int | None = None
    approvals: int | None = None
    calibrate: bool | None = None
    top_limit_frac: float | None = None
    detector: str | None = None
    calm_history: int | None = None

    MODEL_KNOBS = ("misprice", "misprice_shape", "windows", "p_burst", "burst_len", "correlated")

    def changes(self, names: tuple[str, ...]) -> dict[str, object]:
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def apply(self, exp: Experiment) -> Experiment:
        model_changes = self.changes(self.MODEL_KNOBS)
        arm_knobs = tuple(f.name for f in fields(self) if f.name not in self.MODEL_KNOBS)

        def arm(spec: Spec) -> Spec:
            if not is_dataclass(spec) or isinstance(spec, type):
                return spec
            have = {f.name for f in fields(spec)}
            mine = {k: v for k, v in self.changes(arm_knobs).items() if k in have}
            return cast(Spec, replace(spec, **mine))

        cases = tuple(
            replace(
                c,
                scenario=replace(c.scenario, model=c.scenario.model.with_(**model_changes)),
                arms=tuple((label, arm(spec)) for label, spec in c.arms),
            )
            for c in exp.cases
        )
        return replace(exp, cases=cases)


EXPERIMENTS: dict[str, Callable[[tuple[int, ...]], Experiment]] = {
    "e1": e1,
    "fleet": fleet,
    "windows": windows,
    "reauth": reauth,
    "fairshare": fairshare,
    "attack": attack,
    "budget": budget_sweep,
    "misprice": misprice,
    "corr": correlated,
    "breaker": breaker,
    "toctou": toctou,
    "settle": settle,
    "spike": spike,
    "pareto": pareto,
    "calibration": calibration,
}
DEFAULT_AGENTS: dict[str, tuple[int, ...]] = {"fleet": FLEET_SIZES}


def _latency(spec: Spec) -> int | None:
    if getattr(spec, "approvals", 0) == 0:
        return None
    return int(getattr(spec, "approval_latency", 0))


def run_case(
    case: Case, seeds: int, on_arm: Callable[[], None] = lambda: None
) -> list[dict[str, object]]:
    wl = workload.build(case.scenario, range(case.seed0, case.seed0 + seeds))
    rows: list[dict[str, object]] = []
    for label, spec in case.arms:
        summary = metrics.summarize(metrics.per_seed(wl, runner.run(spec.build(wl), wl)))
        rows.append(
            {
                "case": case.label,
                "x": case.x,
                "arm": label,
                "seed0": case.seed0,
                # None where the arm has no such thing (nothing settles, no human asked)
                "settle_delay": getattr(spec, "settle_delay", None),
                "approval_latency": _latency(spec),
                "misprice": case.scenario.model.misprice,
                **asdict(summary),
            }
        )
        on_arm()
    return rows
