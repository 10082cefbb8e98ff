"""The simulator's prediction of the seed's table: each row on virtual time.

Beside ``batchserve demo``'s measured rows, the same settings, schedule, deadlines and model
cost, run as the server would run them with no overhead of its own.
"""

from __future__ import annotations

from batchserve.config import CostEstimate
from batchserve.sim.engine import simulate
from batchserve.workload.arrivals import arrival_times
from batchserve.workload.seed import (
    SEED_DURATION_S,
    SEED_FIXED_S,
    SEED_PER_ITEM_S,
    SEED_QUEUE,
    SEED_RATE,
    SEED_TIMEOUT_S,
    SeedRow,
    seed_scenarios,
)
from batchserve.workload.summary import LoadSummary

__all__ = ["predict_seed_demo"]


def predict_seed_demo(
    *,
    rate: float = SEED_RATE,
    duration_s: float = SEED_DURATION_S,
    timeout_s: float = SEED_TIMEOUT_S,
    queue_size: int = SEED_QUEUE,
    fixed_s: float = SEED_FIXED_S,
    per_item_s: float = SEED_PER_ITEM_S,
    scenarios: list[SeedRow] | None = None,
) -> list[LoadSummary]:
    """The simulator's prediction for each row of :func:`run_seed_demo`.

    The same settings, schedule, deadlines and model cost, on virtual time: the server as
    it would run with no overhead of its own. Instant and deterministic.
    """
    schedule = arrival_times(rate=rate, duration_s=duration_s)
    cost = CostEstimate(fixed_s=fixed_s, per_item_s=per_item_s)
    return [
        simulate(
            config=sc.config,
            cost=cost,
            arrivals=schedule,
            timeout_s=timeout_s,
            duration_s=duration_s,
            name=sc.name,
        ).summary
        for sc in (scenarios if scenarios is not None else seed_scenarios(queue_size=queue_size))
    ]
