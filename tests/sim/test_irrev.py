from __future__ import annotations

import numpy as np
import pytest

from sim import runner, workload
from sim.irrev import Irrev
from sim.params import Attack, Model, Scenario
from sim.runner import B


class _Watched:
    """Wraps an irrev arm and records the worst balance/limit ratio right after admissions."""

    def __init__(self, spec: Irrev, wl: workload.Workload) -> None:
        self.arm = spec.build(wl)
        self.worst = 0.0

    def decide(self, k: int, live: B) -> tuple[B, B]:
        return self.arm.decide(k, live)

    def commit(self, k: int, executed: B) -> None:
        before_over = (self.arm.balance > self.arm.limit).any(axis=1)
        self.arm.commit(k, executed)
        # an admission may only happen into an account with room; overruns come from settlement
        ok = ~executed | ~before_over
        assert ok.all()
        touched = np.take_along_axis(self.arm.balance, self.arm.accounts[:, k], 1)
        lim = np.take_along_axis(self.arm.limit, self.arm.accounts[:, k], 1)
        ratio = np.where(executed[:, None], touched / lim, 0.0)
        self.worst = max(self.worst, float(ratio.max()))


@pytest.mark.parametrize(
    "scenario",
    [Scenario(), Scenario(Model(correlated=True)), Scenario(attack=Attack(declared_factor=0.226))],
    ids=["calm", "correlated", "misdeclared"],
)
@pytest.mark.parametrize("stressed", [False, True], ids=["irrev", "irrev-stressed"])
def test_admitted_charge_never_above_limit(scenario: Scenario, stressed: bool) -> None:
    wl = workload.build(scenario, range(500, 540))
    watched = _Watched(Irrev(stressed=stressed), wl)
    runner.run(watched, wl)
    assert watched.worst <= 1.0


def test_misdeclared_fragments_pay_the_catalog_price() -> None:
    honest = workload.build(Scenario(attack=Attack()), range(3))
    lying = workload.build(Scenario(attack=Attack(declared_factor=0.01)), range(3))
    a, b = Irrev().build(honest), Irrev().build(lying)
    np.testing.assert_array_equal(a.price, b.price)


def test_settlement_returns_the_unused_hold() -> None:
    wl = workload.build(Scenario(), range(1))
    arm = Irrev(settle_delay=1).build(wl)
    out = runner.run(arm, wl)
    settled = out.executed[0, : int(arm.settled[0])]
    posted = arm.residual[0, : settled.size][settled].sum()
    assert arm.posted[0, 0] == posted
