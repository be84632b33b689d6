"""Self-calibrating hold prices (pricing/calibration.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pydantic import ValidationError
from scipy.stats import binom
from scipy.stats import t as student_t

from pricing.calibration import (
    LOOKS,
    POOL_MIN,
    Evidence,
    Prior,
    exceedances_needed,
    hold_factor,
    mean_bound,
    pooled_pending,
    proven_tail,
    route_factor,
    route_quote,
    student_t_ppf,
)
from pricing.catalog import route_pricing
from pricing.distributions import normal_ppf
from pricing.models import Calibration, QuantilePricing, quantile_lgd
from pricing.policy import Route

ALPHA = 0.001
CATALOG = Prior.from_catalog(6.0, 2.0, 0.0, 1 - ALPHA, 20.0)


def _evidence(factors: np.ndarray) -> Evidence:
    ev = Evidence()
    for f in factors:
        ev = ev.observe(float(f))
    return ev


def test_prior_has_the_catalog_moments_and_quantile() -> None:
    assert CATALOG.mean == pytest.approx(0.25)
    assert CATALOG.variance == pytest.approx(6 * 2 / (8 * 8 * 9))
    assert CATALOG.tail == quantile_lgd(6.0, 2.0, 0.0, 1 - ALPHA)


def test_without_evidence_a_fast_route_holds_at_least_the_catalog_tail() -> None:
    f = hold_factor(CATALOG, Evidence(), pending=0.5, alpha=ALPHA)
    assert CATALOG.tail <= f <= 1.0


def test_a_world_as_priced_keeps_the_catalog_price() -> None:
    rng = np.random.default_rng(7)
    ev = _evidence(1.0 - rng.beta(6.0, 2.0, 2000))
    assert hold_factor(CATALOG, ev, pending=1, alpha=ALPHA) == pytest.approx(CATALOG.tail, rel=0.05)
    assert mean_bound(CATALOG, ev, 0.95) == pytest.approx(0.25, abs=0.02)


def test_a_world_twice_as_lossy_is_held_at_face_value_within_a_hundred_settlements() -> None:
    rng = np.random.default_rng(8)
    ev = _evidence(np.minimum(1.0, 2.0 * (1.0 - rng.beta(6.0, 2.0, 100))))
    assert hold_factor(CATALOG, ev, pending=1, alpha=ALPHA) == 1.0


def test_failed_compensations_prove_a_tail_at_face_value() -> None:
    rng = np.random.default_rng(9)
    factors = 1.0 - rng.beta(6.0, 2.0, 200)
    factors[:3] = 1.0  # three failures in 200: far above a 0.001 tail
    ev = _evidence(factors)
    assert proven_tail(ev, ALPHA, 0.95) == 1.0
    assert hold_factor(CATALOG, ev, pending=1, alpha=ALPHA) == 1.0


def _t(n: int) -> float:
    return float(student_t.ppf(1 - ALPHA / LOOKS, n - 1))


def test_a_slow_route_is_priced_nearer_its_mean_once_its_settlements_say_so() -> None:
    rng = np.random.default_rng(11)
    factors = 1.0 - rng.beta(6.0, 2.0, 2000)
    ev = _evidence(factors)
    q = route_quote(CATALOG, ev, alpha=ALPHA)
    prices = [hold_factor(CATALOG, ev, pending=m, alpha=ALPHA) for m in (1, 4, 25, 1e6)]
    assert prices == sorted(prices, reverse=True)
    assert prices[0] == q.tail
    assert q.centre == pytest.approx(factors.mean())
    # the prediction bound of the mean of m new draws, 1/n its centre's own doubt
    assert prices[1] == pytest.approx(q.centre + q.luck * np.sqrt(1 / 4 + 1 / 2000))
    assert prices[-1] == pytest.approx(0.25, abs=0.03)  # near the mean of a world as priced


def test_without_settlements_a_hold_stands_alone_however_slow_its_route() -> None:
    """Pooling averages out luck, not a wrong catalog: no evidence, no discount."""
    alone = hold_factor(CATALOG, Evidence(), pending=1, alpha=ALPHA)
    assert hold_factor(CATALOG, Evidence(), pending=50, alpha=ALPHA) == alone


def test_fewer_settlements_than_pool_min_pool_nothing() -> None:
    few = _evidence(np.full(POOL_MIN - 1, 0.25))
    alone = hold_factor(CATALOG, few, pending=1, alpha=ALPHA)
    assert hold_factor(CATALOG, few, pending=1e6, alpha=ALPHA) == alone
    enough = _evidence(np.full(POOL_MIN, 0.25))
    assert hold_factor(CATALOG, enough, pending=1e6, alpha=ALPHA) < alone


def test_pooling_never_averages_below_what_the_route_itself_shows() -> None:
    """A catalog that says 0.25 where every settlement shows 0.5 (a 2x world): the
    prior's 20 pseudo-settlements pull the posterior's bound under 0.5, but a price for
    very many pending holds stays above the settlements' own mean."""
    ev = _evidence(np.full(40, 0.5))
    assert mean_bound(CATALOG, ev, 0.95) < 0.5
    assert hold_factor(CATALOG, ev, pending=1e9, alpha=ALPHA) > 0.5


def test_a_few_unlucky_settlements_buy_little_discount() -> None:
    """Ten settlements at 0.3 in a world whose mean is 0.5: the bound's 1/n term and
    Student's t keep a burst of 20 holds priced far above what ten draws suggest."""
    ten = _evidence(np.full(10, 0.3))
    many = _evidence(np.full(1000, 0.3))
    assert hold_factor(CATALOG, ten, pending=20, alpha=ALPHA) >= 0.6
    assert hold_factor(CATALOG, many, pending=20, alpha=ALPHA) < 0.6


def test_a_tail_at_face_value_still_leaves_each_hold_its_spread() -> None:
    """A 3x world: the tail is capped at 1, so tail - centre understates one hold's
    spread; the pooled price keeps t sd sqrt(1/m + 1/n) above the centre."""
    factors = np.tile([0.2, 0.5, 0.8, 1.0, 1.0], 8)  # 40 settlements, mean 0.7
    ev = _evidence(factors)
    q = route_quote(CATALOG, ev, alpha=ALPHA)
    assert q.tail == 1.0
    # the catalog's sd scaled by 0.7 / 0.25 is above these factors' own
    sd = max(float(np.std(factors, ddof=1)), np.sqrt(CATALOG.variance) * 0.7 / 0.25)
    assert q.luck == pytest.approx(_t(40) * sd, rel=0.01)
    assert q.luck > q.tail - q.centre
    expected = q.centre + q.luck * np.sqrt(1 / 100 + 1 / 40)
    assert hold_factor(CATALOG, ev, pending=100, alpha=ALPHA) == pytest.approx(min(1.0, expected))


def test_identical_settlements_spread_no_less_than_the_catalog_scaled_says() -> None:
    sd = np.sqrt(CATALOG.variance)
    at_catalog = route_quote(CATALOG, _evidence(np.full(30, 0.25)), alpha=ALPHA)  # sd 0 by luck
    assert at_catalog.luck == pytest.approx(max(at_catalog.tail - 0.25, _t(30) * sd), rel=0.01)
    twice = route_quote(CATALOG, _evidence(np.full(30, 0.5)), alpha=ALPHA)
    assert twice.luck >= _t(30) * 2 * sd * 0.99


def test_the_t_quantile_is_within_a_percent_from_nine_degrees_of_freedom() -> None:
    for p in (0.99, 0.999, 0.9999):
        for df in (9, 30, 200):
            assert student_t_ppf(p, df) == pytest.approx(student_t.ppf(p, df), rel=0.01)
    assert student_t_ppf(0.999, 9) > normal_ppf(0.999)


@pytest.mark.parametrize("n", [10, 40, 400])
def test_more_pending_never_costs_more_and_one_costs_the_tail(n: int) -> None:
    rng = np.random.default_rng(n)
    ev = _evidence(np.minimum(1.0, 1.5 * (1.0 - rng.beta(6.0, 2.0, n))))
    q = route_quote(CATALOG, ev, alpha=ALPHA)
    prices = [q.factor(m) for m in (0.5, 1, 1.5, 3, 10, 100, 1e4)]
    assert prices[0] == prices[1] == q.tail
    assert all(a >= b for a, b in itertools.pairwise(prices))
    assert prices[-1] >= q.mean


@pytest.mark.parametrize("n", [1, 10, 150, 3000])
def test_exceedances_needed_is_the_binomial_threshold(n: int) -> None:
    e = exceedances_needed(n, ALPHA, 0.95)
    if e <= n:
        assert binom.sf(e - 1, n, ALPHA) < 0.05
    assert e == 1 or binom.sf(e - 2, n, ALPHA) >= 0.05


def test_no_settlement_proves_nothing_and_one_total_loss_proves_a_lot() -> None:
    assert proven_tail(Evidence(), ALPHA, 0.95) == 0.0
    # a total loss in one draw has probability <= 0.001 if the 0.999 quantile is below 1
    assert proven_tail(_evidence(np.array([1.0])), ALPHA, 0.95) == 1.0


def test_what_settlements_prove_of_a_world_as_priced_stays_below_its_tail() -> None:
    rng = np.random.default_rng(10)
    proven = [proven_tail(_evidence(1.0 - rng.beta(6.0, 2.0, 500)), ALPHA, 0.95) for _ in range(40)]
    # a 95% lower bound: at most a few of 40 samples may overshoot the true quantile
    assert sum(p > CATALOG.tail for p in proven) <= 6


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_a_factor_outside_the_unit_interval_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="within"):
        Evidence().observe(bad)


def test_pending_must_be_positive() -> None:
    with pytest.raises(ValueError, match="pending"):
        hold_factor(CATALOG, Evidence(), pending=0, alpha=ALPHA)


def _route(pending: float | str | None) -> QuantilePricing:
    calibrate = {"weight": 20} if pending is None else {"weight": 20, "pending": pending}
    return QuantilePricing.model_validate(
        {
            "model": "quantile",
            "recovery": {"alpha": 6, "beta": 2},
            "level": 1 - ALPHA,
            "surcharge": 0.1,
            "calibrate": calibrate,
        }
    )


def test_a_route_pools_over_the_holds_open_up_to_its_policys_pending() -> None:
    """`calibrate.pending` caps the open holds a gateway's price pools over."""
    rng = np.random.default_rng(7)
    ev = _evidence(1 - rng.beta(6.0, 2.0, 400))  # a world as priced
    capped = _route(5.0)
    alone = hold_factor(CATALOG, ev, pending=1.0, alpha=ALPHA) * 1.1
    five = hold_factor(CATALOG, ev, pending=5.0, alpha=ALPHA) * 1.1
    assert five < alone
    assert route_factor(capped, ev) == pytest.approx(alone, rel=1e-12)
    assert route_factor(capped, ev, 3.0) == pytest.approx(
        hold_factor(CATALOG, ev, pending=3.0, alpha=ALPHA) * 1.1, rel=1e-12
    )
    assert route_factor(capped, ev, 500.0) == pytest.approx(five, rel=1e-12)
    assert route_factor(_route("live"), ev, 500.0) < five  # no cap: as many as are open
    assert route_factor(_route("live"), ev, 500.0) == route_factor(_route(1e6), ev, 500.0)


def test_a_policy_that_does_not_opt_in_prices_every_hold_alone() -> None:
    """review1 F5: `pending` defaulted to 1 (every hold alone) before the gateway
    counted open holds; a policy written then must keep its prices on upgrade, so
    pooling is opted into (a number above 1 or 'live'), never the default."""
    rng = np.random.default_rng(7)
    ev = _evidence(1 - rng.beta(6.0, 2.0, 400))
    alone = hold_factor(CATALOG, ev, pending=1.0, alpha=ALPHA) * 1.1
    assert route_factor(_route(None), ev, 500.0) == pytest.approx(alone, rel=1e-12)
    assert route_pricing_of(_route(None)) is None
    assert route_pricing_of(_route("live")) is not None


def route_pricing_of(spec: QuantilePricing) -> object:
    """The pooling a compiled route of `spec` carries (None: priced alone, its holds
    not counted by the ledger)."""
    route = Route.model_validate(
        {
            "tool": "pay",
            "route": "POST /charges",
            "class": "compensable",
            "face_value": "amount",
            "body": ["amount"],
            "pricing": spec.model_dump(),
        }
    )
    return route_pricing(route)[2]


@pytest.mark.parametrize("bad", ["LIVE", "all", 0.5, 0, "1", None])
def test_pending_is_a_number_from_1_or_live(bad: object) -> None:
    with pytest.raises(ValidationError):
        Calibration.model_validate({"pending": bad})


@pytest.mark.parametrize(
    ("seen", "priced"), [(1.0, 1.0), (2.0, 1.0), (4.0, 2.0), (9.0, 6.0), (100.0, 90.0)]
)
def test_a_gateway_prices_for_one_poisson_sd_fewer_than_it_saw(seen: float, priced: float) -> None:
    assert pooled_pending(seen) == pytest.approx(priced)


@pytest.mark.parametrize("bad", [0.5, float("nan"), float("inf")])
def test_an_open_set_smaller_than_the_hold_itself_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        pooled_pending(bad)
