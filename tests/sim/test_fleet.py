"""The fleet simulator: N replicas of the policy behind a router, on virtual time."""

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import ConfigError
from batchserve.sim import ROUTINGS, simulate, simulate_fleet
from batchserve.workload.arrivals import arrival_times

SEED_COST = CostEstimate(fixed_s=0.008, per_item_s=0.00025)
CONFIG = BatchConfig(max_batch_size=32, max_wait_s=0.002, queue_size=64)
ONE_AT_A_TIME = BatchConfig(max_batch_size=1, max_wait_s=0.0, queue_size=8, admission=False)
TEN_MS = CostEstimate(fixed_s=0.010, per_item_s=0.0)


@pytest.mark.parametrize("routing", ROUTINGS)
def test_one_replica_is_the_single_server_simulator(routing: str) -> None:
    arrivals = arrival_times(rate=3000, duration_s=1.0, arrivals="poisson", seed=3)
    single = simulate(
        config=CONFIG, cost=SEED_COST, arrivals=arrivals, timeout_s=0.25, duration_s=1.0
    )
    fleet = simulate_fleet(
        replicas=1,
        routing=routing,
        config=CONFIG,
        cost=SEED_COST,
        arrivals=arrivals,
        timeout_s=0.25,
        duration_s=1.0,
        name="simulated",
    )
    assert fleet.summary == single.summary
    assert (fleet.late, fleet.expired, fleet.batches) == (
        single.late,
        single.expired,
        single.batches,
    )
    assert fleet.retries == 0


def test_five_at_once_on_three_replicas_exact_timeline() -> None:
    # One item per pass of 10 ms: three start at 0, the fourth and fifth queue behind the
    # first two replicas and finish at 20 ms.
    for routing in ("round_robin", "least_conn"):
        fleet = simulate_fleet(
            replicas=3, routing=routing, config=ONE_AT_A_TIME, cost=TEN_MS, arrivals=[0.0] * 5
        )
        assert [r.ok for r in fleet.per_replica] == [2, 2, 1]
        assert fleet.summary.ok == 5
        assert fleet.end_s == pytest.approx(0.020)
        assert fleet.summary.p50_ms == pytest.approx(10.0)
        assert fleet.summary.max_ms == pytest.approx(20.0)


def test_round_robin_spreads_evenly_and_counters_add_up() -> None:
    arrivals = arrival_times(rate=6000, duration_s=1.0, arrivals="constant", seed=0)
    fleet = simulate_fleet(
        replicas=4,
        routing="round_robin",
        config=CONFIG,
        cost=SEED_COST,
        arrivals=arrivals,
        timeout_s=0.25,
        duration_s=1.0,
        max_tries=1,
    )
    attempts = [r.attempts for r in fleet.per_replica]
    assert max(attempts) - min(attempts) <= 1
    assert sum(attempts) == fleet.summary.sent
    for r in fleet.per_replica:
        assert r.attempts == r.ok + r.rejected + r.late + r.expired
        assert r.items == r.ok + r.late
    assert sum(r.ok for r in fleet.per_replica) == fleet.summary.ok


@pytest.mark.parametrize("routing", ROUTINGS)
def test_capacity_scales_with_replicas(routing: str) -> None:
    # Offered: 3x what one replica serves at batch 32 (about 2,000/s each).
    arrivals = arrival_times(rate=7500, duration_s=2.0, arrivals="poisson", seed=1)
    kwargs = {
        "routing": routing,
        "config": CONFIG,
        "cost": SEED_COST,
        "arrivals": arrivals,
        "timeout_s": 0.25,
        "duration_s": 2.0,
    }
    one = simulate_fleet(replicas=1, **kwargs).summary  # type: ignore[arg-type]
    three = simulate_fleet(replicas=3, **kwargs).summary  # type: ignore[arg-type]
    assert 2.85 <= three.ok_per_s / one.ok_per_s <= 3.05, (one.ok_per_s, three.ok_per_s)


def test_retrying_refusals_serves_more_and_refuses_only_when_all_refused() -> None:
    # 1.3x the capacity of 3 replicas with small queues: refusals are common.
    small = BatchConfig(max_batch_size=8, max_wait_s=0.002, queue_size=8)
    arrivals = arrival_times(rate=2500, duration_s=2.0, arrivals="poisson", seed=7)
    kwargs = {
        "replicas": 3,
        "config": small,
        "cost": SEED_COST,
        "arrivals": arrivals,
        "timeout_s": 0.25,
        "duration_s": 2.0,
    }
    once = simulate_fleet(routing="round_robin", max_tries=1, **kwargs)  # type: ignore[arg-type]
    every = simulate_fleet(routing="round_robin", **kwargs)  # type: ignore[arg-type]
    assert once.retries == 0
    assert every.retries > 0
    assert every.summary.ok > once.summary.ok
    refusals = sum(r.rejected for r in every.per_replica)
    # Every retry follows a refusal, and a request refused to its client was refused by
    # all three replicas.
    assert refusals == every.retries + every.summary.rejected
    assert sum(r.attempts for r in every.per_replica) == every.summary.sent + every.retries
    assert every.summary.rejected * 3 <= refusals


def test_power_of_two_is_seeded() -> None:
    arrivals = arrival_times(rate=5000, duration_s=0.5, arrivals="poisson", seed=2)
    kwargs = {
        "replicas": 8,
        "routing": "power_of_two",
        "config": CONFIG,
        "cost": SEED_COST,
        "arrivals": arrivals,
        "timeout_s": 0.25,
    }
    a = simulate_fleet(seed=1, **kwargs)  # type: ignore[arg-type]
    b = simulate_fleet(seed=1, **kwargs)  # type: ignore[arg-type]
    c = simulate_fleet(seed=2, **kwargs)  # type: ignore[arg-type]
    assert a == b
    assert [r.attempts for r in a.per_replica] != [r.attempts for r in c.per_replica]


def test_late_items_stay_outstanding_until_their_deadline() -> None:
    # A 10 ms pass with a 5 ms deadline (admission off): answered late at 5 ms, while the
    # pass runs on to 10 ms.
    fleet = simulate_fleet(
        replicas=1,
        routing="least_conn",
        config=ONE_AT_A_TIME,
        cost=TEN_MS,
        arrivals=[0.0],
        timeout_s=0.005,
    )
    assert (fleet.late, fleet.summary.ok, fleet.summary.timed_out) == (1, 0, 1)
    assert fleet.end_s == pytest.approx(0.005)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replicas": 0}, "replicas must be >= 1, got 0"),
        ({"routing": "random"}, "routing must be one of round_robin, least_conn, power_of_two"),
        ({"max_tries": 0}, "max_tries must be >= 1, got 0"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "replicas": 2,
        "routing": "least_conn",
        "config": CONFIG,
        "cost": SEED_COST,
        "arrivals": [0.0],
    }
    with pytest.raises(ConfigError, match=message):
        simulate_fleet(**{**base, **kwargs})  # type: ignore[arg-type]
