"""`irrev sim run`: a tenant's policy file and a workload file, simulated."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from irrev.cli import main
from pricing import Evidence, QuantilePricing, load_policy_text
from pricing.calibration import route_factor
from sim import world
from sim.irrev import Irrev
from sim.workload import build

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
POLICY = EXAMPLES / "procurement.yaml"
WORKLOAD = EXAMPLES / "workloads" / "procurement.yaml"


def _spec(**changes: object) -> world.WorkloadSpec:
    data = yaml.safe_load(WORKLOAD.read_text())
    return world.parse_workload({**data, **changes}, "w")


def test_the_example_runs_and_reports_the_policy_arm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "run", "--policy", str(POLICY), "--workload", str(WORKLOAD)]
    assert main([*argv, "--seeds", "6", "--out", str(tmp_path)]) == 0
    assert "policy" in capsys.readouterr().out
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["seeds"] == 6 and data["seed_blocks"] == [500_000]
    assert data["workload"] == str(WORKLOAD) and data["not_simulated"]
    assert {r["arm"] for r in data["rows"]} == {"local", "budget", "policy"}
    mine = next(r for r in data["rows"] if r["arm"] == "policy")
    assert mine["settle_delay"] == 20 and mine["approval_latency"] == 10
    assert (tmp_path / "run.png").stat().st_size > 0


def test_the_policy_sets_the_price_limits_and_caps() -> None:
    policy = load_policy_text(POLICY.read_text(), str(POLICY))
    exp = world.world(policy, _spec(), "w")
    (case,) = exp.cases
    arm = dict(case.arms)["policy"]
    assert isinstance(arm, Irrev)
    route = next(
        r
        for g in policy.catalog.routes.values()
        for r in g
        if r.route_id == "supplier POST /orders"
    )
    # the price the gateway reserves, not a number of the simulator's own
    assert arm.price_factor == route.loss_factor
    model = case.scenario.model
    assert model.tolerance == 250_000 and model.value_cap == 50_000
    assert arm.top_limit_frac == 200_000 / 250_000  # the procurement principal's limit
    assert arm.agent_limit_frac == 100_000 / 250_000  # buyer-01's window cap
    assert arm.supplier_limit_frac == 100_000 / 250_000  # "supplier:*"
    assert len(model.lines) == 10 and model.lines[0].world_shape == (5.0, 3.0)
    assert (model.lines[0].recovery_a, model.lines[0].recovery_b) == (6.0, 2.0)
    # the policy's 30m escalation TTL in a 24h window of 1000 ticks, at least the latency
    assert arm.escalation_ttl == 21


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"agents": 0}, "agents: Input should be greater than 0"),
        ({"call_rate": "fast"}, "call_rate"),
        ({"nonsense": 1}, "nonsense: Extra inputs are not permitted"),
        ({"route": "supplier DELETE /orders"}, "not in the policy"),
        ({"agent": "nobody"}, "not in the policy's agents"),
        ({"route": "supplier GET /catalog"}, "is a read"),
        ({"burst": {"rate": 0.05, "length": 900}}, "burst length"),
    ],
)
def test_a_bad_workload_is_one_line_and_exit_2(
    tmp_path: Path, changes: dict[str, object], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load(WORKLOAD.read_text()), **changes}))
    argv = ["sim", "run", "--policy", str(POLICY), "--workload", str(bad)]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("- not\n- a mapping\n", "must be a mapping"),
        ("value: {median: 1\n", "not valid YAML"),
        ("agents: 5\nagents: 6\n", "duplicate key"),
    ],
)
def test_a_workload_that_is_no_mapping_is_one_line_and_exit_2(
    tmp_path: Path, text: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    argv = ["sim", "run", "--policy", str(POLICY), "--workload", str(bad)]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_run_needs_both_files_and_they_belong_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "run", "--policy", str(POLICY), "--out", str(tmp_path)]) == 2
    assert main(["sim", "e1", "--workload", str(WORKLOAD), "--out", str(tmp_path)]) == 2
    assert (
        main(
            [
                "sim",
                "run",
                "--policy",
                str(tmp_path / "none.yaml"),
                "--workload",
                str(WORKLOAD),
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "cannot read the policy" in err[2]


@pytest.mark.parametrize(
    ("calibrate", "pending", "cap"),
    [
        ("{weight: 20}", 1.0, 1.0),  # the default: every hold alone, as the gateway
        ("{weight: 20, pending: 5}", None, 5.0),
        ("{weight: 20, pending: live}", None, float("inf")),
    ],
)
def test_the_simulator_pools_as_the_policys_calibrate_pending_says(
    calibrate: str, pending: float | None, cap: float
) -> None:
    """review1's note: `irrev sim run` counted the open holds whatever the policy's
    calibrate.pending said; it now prices as the gateway would (alone by default, at
    most the policy's cap)."""
    plain = "pricing: {model: quantile, recovery: {alpha: 6, beta: 2}, level: 0.999}"
    text = POLICY.read_text()
    assert plain in text
    text = text.replace(plain, plain[:-1] + f", calibrate: {calibrate}}}", 1)
    policy = load_policy_text(text, str(POLICY))
    (case,) = world.world(policy, _spec(), "w").cases
    arm = dict(case.arms)["policy"]
    assert isinstance(arm, Irrev)
    assert (arm.pending, arm.pending_cap) == (pending, cap)


def _calibrating(calibrate: str, extra: str = "") -> str:
    """The example policy with its POST /orders route calibrating as `calibrate` says."""
    plain = "pricing: {model: quantile, recovery: {alpha: 6, beta: 2}, level: 0.999}"
    text = POLICY.read_text()
    assert plain in text
    return text.replace(plain, plain[:-1] + f"{extra}, calibrate: {calibrate}}}", 1)


def test_a_route_calibrates_only_where_its_policy_does() -> None:
    """The audit: a workload's `calibrate: true` calibrated a route whose policy does not
    (pooling without a cap). Whether a route calibrates is now the policy's alone."""
    policy = load_policy_text(POLICY.read_text(), str(POLICY))
    (case,) = world.world(policy, _spec(), "w").cases
    arm = dict(case.arms)["policy"]
    assert isinstance(arm, Irrev) and not arm.calibrate
    with pytest.raises(world.WorkloadError, match="calibrate: whether a route calibrates"):
        _spec(calibrate=True)
    calibrating = load_policy_text(_calibrating("{pending: 5}"), str(POLICY))
    (case,) = world.world(calibrating, _spec(), "w").cases
    arm = dict(case.arms)["policy"]
    assert isinstance(arm, Irrev) and arm.calibrate and arm.pending_cap == 5.0


def test_the_calibrated_prior_is_the_policys_not_the_worlds() -> None:
    """The audit: the prior took the world's compensation failure rate. A world whose
    compensation fails far more often than the policy believes must not move the
    first price, which is the gateway's for a route with no settlements."""
    text = _calibrating("{weight: 10, confidence: 0.9}", ", p_fail: 0.01, surcharge: 0.1")
    policy = load_policy_text(text, str(POLICY))
    spec = _spec(compensation_fails=0.4, seeds=4)
    (case,) = world.world(policy, spec, "w").cases
    arm_spec = dict(case.arms)["policy"]
    assert isinstance(arm_spec, Irrev)
    wl = build(case.scenario, range(spec.seed0, spec.seed0 + spec.seeds))
    arm = arm_spec.build(wl)
    arm.decide(0, wl.valid[:, 0])
    (route,) = [r for r in policy.document.routes if r.route == "POST /orders"]
    assert isinstance(route.pricing, QuantilePricing)
    gateway = route_factor(route.pricing, Evidence())
    face = np.ceil(wl.value[:, 0] * 1e6)
    assert list(arm.price[:, 0]) == list(np.ceil(face * gateway).astype(np.int64))


def test_run_refuses_calibrate_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["sim", "run", "--policy", str(POLICY), "--workload", str(WORKLOAD), "--calibrate"]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert "calibrates where the policy's route does" in capsys.readouterr().err
