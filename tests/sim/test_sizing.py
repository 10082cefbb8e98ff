"""Sizing a fleet on the simulator: the fewest replicas that meet a p99 target."""

import json

import pytest

from batchserve.cli import main
from batchserve.config import CostEstimate
from batchserve.errors import ConfigError
from batchserve.sim.sizing import size_fleet
from batchserve.sim.tuning import Scenario, rate_bound

SEED_COST = CostEstimate(fixed_s=0.008, per_item_s=0.00025)


def scenario(rate: float, p99_s: float = 0.05) -> Scenario:
    return Scenario(rate=rate, p99_target_s=p99_s, cost=SEED_COST, queue_size=256)


def test_fewest_replicas_meet_and_one_fewer_does_not() -> None:
    sc = scenario(6000)
    plan = size_fleet(sc, max_workers=1, max_batch_size=64, confirm_requests=2000)
    assert plan.met
    assert plan.replicas is not None
    assert plan.best is not None
    assert plan.best.meets
    assert plan.best.p99_ms <= 50.0
    assert plan.best.served >= 0.99
    # One replica serves at most rate_bound within the target: the answer is at least the
    # floor, and either is the floor or one fewer was checked and failed.
    floor = -(-6000 // int(rate_bound(sc, max_workers=1)))
    assert plan.replicas >= floor
    fewer = [c for c in plan.checked if c.replicas == plan.replicas - 1]
    assert plan.replicas == floor or (fewer and not fewer[0].meets)


def test_no_fleet_when_one_pass_is_over_the_target() -> None:
    plan = size_fleet(scenario(1000, p99_s=0.005), max_workers=1)
    assert not plan.met
    assert plan.replicas is None
    assert plan.checked == ()


def test_no_fleet_within_max_replicas() -> None:
    plan = size_fleet(scenario(6000), max_workers=1, max_batch_size=64, max_replicas=2)
    assert not plan.met
    assert [c.replicas for c in plan.checked] == [2]


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ConfigError, match="max_replicas must be >= 1, got 0"):
        size_fleet(scenario(100), max_replicas=0)
    with pytest.raises(ConfigError, match="routing must be one of"):
        size_fleet(scenario(100), routing="dns")


def test_tune_max_replicas_prints_the_count_and_the_serve_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["tune", "--rate", "6000", "--p99", "50ms", "--queue-size", "256"]
    args += ["--max-workers", "1", "--max-batch-limit", "64", "--max-replicas", "64"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "sizing a fleet for 6000 requests/s with p99 <= 50ms" in out
    assert "batchserve serve --max-batch-size" in out
    assert main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["met"] is True
    assert f"needs {plan['replicas']} replicas" in out
    assert main([*args[:-1], "2"]) == 1
    assert "no fleet of up to 2 replicas meets" in capsys.readouterr().out
