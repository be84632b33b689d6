"""Workload generation: every arm of one experiment sees these same events (CRN).

A workload is a padded event table of shape (S, K): S seeds, K = the largest number
of events of any seed. Events of a seed are in time order, and within a tick in agent
order, with the attacker's fragment (if any) last, as in the published simulator.
Padding slots have `valid == False` and tick == model.horizon.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import beta as beta_dist

from sim.params import Attack, Model, Scenario

# the attacker's stream is seeded from the seed plus this tag, so adding an attack never
# shifts the honest draws
ATTACK_STREAM_TAG = 999_983

PRE, BURST, POST = 0, 1, 2
PHASES = ("pre", "burst", "post")

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Events:
    """One seed's events, unpadded (length k)."""

    tick: I64
    agent: I64
    value: F64
    residual: F64
    frag: B


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Padded event table, all arrays (S, K) except `burst_start` (S,)."""

    model: Model
    attack: Attack | None
    seeds: tuple[int, ...]
    burst_start: I64
    tick: I64
    agent: I64
    supplier: I64
    value: F64  # USD
    residual: F64  # USD, v * (1 - r): what stays lost after compensation
    valid: B
    frag: B
    phase: npt.NDArray[np.int8]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.tick.shape[0], self.tick.shape[1])


def _burst_probability(model: Model, burst_start: int) -> F64:
    p = np.full(model.horizon, model.p_base)
    p[burst_start : burst_start + model.burst_len] = model.p_burst
    return p


def _recovery(model: Model, line_idx: I64, u: F64, in_burst: B) -> F64:
    """Recovery by inverse CDF of one uniform, so calm and correlated draws are comonotone
    (and so are a mispriced world's draws with the catalog's)."""
    a = np.array([ln.world_shape[0] for ln in model.lines])[line_idx]
    b = np.array([ln.world_shape[1] for ln in model.lines])[line_idx]
    if model.misprice_shape == "shape" and model.misprice != 1.0:
        a, b = a + b - model.misprice * b, model.misprice * b
    if model.correlated:
        a = np.where(in_burst, model.corr_a, a)
        b = np.where(in_burst, model.corr_b, b)
    return np.asarray(beta_dist.ppf(u, a, b), dtype=np.float64)


def honest_events(model: Model, rng: np.random.Generator, burst_start: int) -> Events:
    p = _burst_probability(model, burst_start)
    proposes = rng.random((model.horizon, model.n_agents), dtype=np.float32) < p[:, None]
    tick, agent = np.nonzero(proposes)
    line_idx = agent % len(model.lines)
    mu = np.array([ln.value_mu for ln in model.lines])[line_idx]
    sigma = np.array([ln.value_sigma for ln in model.lines])[line_idx]
    value = np.exp(mu + sigma * rng.standard_normal(tick.size))
    in_burst = (tick >= burst_start) & (tick < burst_start + model.burst_len)
    recovery = _recovery(model, line_idx, rng.random(tick.size), in_burst)
    if model.spike is not None:
        value, recovery = _apply_spike(model, rng, line_idx, in_burst, value, recovery)
    if model.p_comp_fail > 0:
        recovery = np.where(rng.random(tick.size) < model.p_comp_fail, 0.0, recovery)
    residual = value * _loss_factor(model, recovery)
    return Events(tick, agent, value, residual, np.zeros(tick.size, bool))


def _loss_factor(model: Model, recovery: F64) -> F64:
    """The realised residual factor 1 - r, scaled by a "scale" mispricing, at most 1."""
    if model.misprice_shape == "scale" and model.misprice != 1.0:
        return np.minimum(1.0, model.misprice * (1.0 - recovery))
    return 1.0 - recovery


def _apply_spike(
    model: Model, rng: np.random.Generator, line_idx: I64, in_burst: B, value: F64, rec: F64
) -> tuple[F64, F64]:
    spike = model.spike
    assert spike is not None
    x = rng.uniform(spike.severity_lo, 1.0)
    supplier = np.array([ln.supplier for ln in model.lines])[line_idx]
    hit = in_burst & (supplier == spike.supplier)
    value = np.where(hit, value * (1.0 + spike.value_gain * x), value)
    rec = np.where(hit, rec * (1.0 - spike.recovery_loss * x), rec)
    return value, rec


def fragment_events(model: Model, attack: Attack, rng: np.random.Generator, bs: int) -> Events:
    """One candidate fragment per tick; arms stop proposing once `total` has moved."""
    tick = np.arange(model.horizon)
    in_burst = (tick >= bs) & (tick < bs + model.burst_len)
    recovery = _recovery(model, np.zeros_like(tick), rng.random(tick.size), in_burst)
    value = np.full(tick.size, attack.piece)
    agent = tick % attack.colluders
    return Events(
        tick, agent, value, value * _loss_factor(model, recovery), np.ones(tick.size, bool)
    )


def seed_events(scenario: Scenario, seed: int) -> tuple[int, Events]:
    model = scenario.model
    rng = np.random.default_rng(seed)
    burst_start = int(rng.integers(100, model.ticks - model.burst_len - 100))
    events = honest_events(model, rng, burst_start)
    if scenario.attack is not None:
        frag_rng = np.random.default_rng([seed, ATTACK_STREAM_TAG])
        frags = fragment_events(model, scenario.attack, frag_rng, burst_start)
        events = _merge(events, frags)
    return burst_start, events


def _merge(a: Events, b: Events) -> Events:
    order = np.lexsort((np.r_[a.frag, b.frag], np.r_[a.tick, b.tick]))
    return Events(
        *(np.r_[getattr(a, f), getattr(b, f)][order] for f in Events.__dataclass_fields__)
    )


def build(scenario: Scenario, seeds: range | list[int]) -> Workload:
    seeds = list(seeds)
    per_seed = [seed_events(scenario, s) for s in seeds]
    k = max(1, max(ev.tick.size for _, ev in per_seed))
    model = scenario.model
    shape = (len(seeds), k)
    tick = np.full(shape, model.horizon, np.int64)
    agent = np.zeros(shape, np.int64)
    value = np.zeros(shape)
    residual = np.zeros(shape)
    valid = np.zeros(shape, bool)
    frag = np.zeros(shape, bool)
    for row, (_, ev) in enumerate(per_seed):
        n = ev.tick.size
        tick[row, :n], agent[row, :n], value[row, :n] = ev.tick, ev.agent, ev.value
        residual[row, :n], valid[row, :n], frag[row, :n] = ev.residual, True, ev.frag
    burst_start = np.array([bs for bs, _ in per_seed], np.int64)
    rel = tick - burst_start[:, None]
    phase = np.where(rel < 0, PRE, np.where(rel < model.burst_len, BURST, POST)).astype(np.int8)
    lines_supplier = np.array([ln.supplier for ln in model.lines])
    supplier = np.where(frag, 0, lines_supplier[agent % len(model.lines)])
    return Workload(
        model=model,
        attack=scenario.attack,
        seeds=tuple(seeds),
        burst_start=burst_start,
        tick=tick,
        agent=agent,
        supplier=supplier,
        value=value,
        residual=residual,
        valid=valid,
        frag=frag,
        phase=phase,
    )
