"""Sizing a fleet with the simulator: the fewest replicas that meet a p99 target.

Theory of operation
-------------------
The question is "how many replicas, and with which batching settings, serve this rate
within this p99?". :func:`size_fleet` answers it on the simulator, in seconds:

1. **a floor**: one replica serves at most :func:`~batchserve.sim.tuning.rate_bound` requests
   per second within the target, so at least ``ceil(rate / bound)`` replicas are needed;
2. **a candidate count** ``n`` is checked in two steps: :func:`~batchserve.sim.tuning.tune`
   finds the best setting for one replica at its share of the rate (``rate / n``, a light
   search); then the whole fleet (``n`` replicas of that setting behind the router, on
   :func:`~batchserve.sim.simulate_fleet`) runs at the full rate on several schedules
   (constant spacing and Poisson with two seeds), pooled as ``tune`` pools them: goodput
   the mean, p99 the worst. ``n`` *meets* the target when the fleet does;
3. **the search**: from the floor, the count doubles until one meets the target (or passes
   ``max_replicas``), then bisects between the last count that failed and the first that
   met. This assumes that a fleet meeting the target still meets it with one more replica,
   which holds for the routers simulated (more replicas, shorter queues).

The answer is the smallest count found, its setting and the fleet's predicted figures;
every count checked is kept, so the report can show why fewer would not do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from batchserve.errors import ConfigError
from batchserve.sim.fleet import ROUTINGS, simulate_fleet
from batchserve.sim.tuning import (
    DEFAULT_WAITS_S,
    Evaluation,
    Scenario,
    Setting,
    pool,
    quick_tune,
    rate_bound,
)
from batchserve.workload.arrivals import arrival_times

__all__ = ["FleetPlan", "SizeCheck", "evaluate_fleet", "size_fleet"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SizeCheck:
    """One replica count checked.

    Attributes:
        replicas: the count.
        evaluation: the fleet's pooled figures with the best setting found for it; None
            when not even one replica's share of the rate can be met by any setting.
    """

    replicas: int
    evaluation: Evaluation | None

    @property
    def meets(self) -> bool:
        """Whether the fleet meets the target."""
        return self.evaluation is not None and self.evaluation.meets

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        ev = self.evaluation
        return {
            "replicas": self.replicas,
            "meets": self.meets,
            "evaluation": ev.to_dict() if ev is not None else None,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetPlan:
    """What :func:`size_fleet` found.

    Attributes:
        scenario: what was given (``rate`` is the whole fleet's).
        routing: the router simulated.
        max_replicas: the most replicas considered.
        replicas: the fewest replicas that meet the target; None when none up to
            ``max_replicas`` does.
        best: that fleet's evaluation (its setting is each replica's); None as above.
        checked: every count checked, in the order checked.
    """

    scenario: Scenario
    routing: str
    max_replicas: int
    replicas: int | None
    best: Evaluation | None
    checked: tuple[SizeCheck, ...]

    @property
    def met(self) -> bool:
        """Whether some count up to ``max_replicas`` meets the target."""
        return self.replicas is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            **self.scenario.to_dict(),
            "routing": self.routing,
            "max_replicas": self.max_replicas,
            "met": self.met,
            "replicas": self.replicas,
            "best": self.best.to_dict() if self.best else None,
            "checked": [c.to_dict() for c in self.checked],
        }


def evaluate_fleet(
    setting: Setting,
    scenario: Scenario,
    schedules: Sequence[tuple[list[float], float]],
    *,
    replicas: int,
    routing: str,
) -> Evaluation:
    """Simulate ``replicas`` replicas of ``setting`` on each schedule and pool the figures.

    The figures are the fleet's as its clients see them, pooled as
    :func:`~batchserve.sim.tuning.evaluate` pools one replica's.
    """
    config = scenario.config(setting)
    summaries = [
        simulate_fleet(
            replicas=replicas,
            routing=routing,
            config=config,
            cost=scenario.cost,
            arrivals=arrivals,
            timeout_s=scenario.timeout_s,
            duration_s=duration_s,
            overhead_s=scenario.overhead_s,
            seed=k,
        ).summary
        for k, (arrivals, duration_s) in enumerate(schedules)
    ]
    return pool(setting, scenario, summaries)


def size_fleet(
    scenario: Scenario,
    *,
    routing: str = "least_conn",
    max_replicas: int = 1024,
    max_workers: int = 4,
    max_batch_size: int = 256,
    waits_s: Sequence[float] = DEFAULT_WAITS_S,
    confirm_requests: int = 4000,
) -> FleetPlan:
    """The fewest replicas, and their setting, that serve ``scenario`` (see the module doc).

    Args:
        scenario: the whole fleet's load, each replica's other settings, the cost of a pass.
        routing: the balancer's rule, one of :data:`~batchserve.sim.ROUTINGS`.
        max_replicas: the most replicas considered.
        max_workers: search 1 to this many workers per replica.
        max_batch_size: the largest batch size searched.
        waits_s: the max waits searched.
        confirm_requests: requests per fleet schedule (each at least 1 s long).

    Returns:
        The plan; ``replicas`` is None when no count up to ``max_replicas`` meets the target.

    Raises:
        ConfigError: ``routing`` is unknown or ``max_replicas`` is not >= 1.
    """
    if routing not in ROUTINGS:
        raise ConfigError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if max_replicas < 1:
        raise ConfigError(f"max_replicas must be >= 1, got {max_replicas}")
    duration_s = max(1.0, confirm_requests / scenario.rate)
    schedules = [
        (
            arrival_times(rate=scenario.rate, duration_s=duration_s, arrivals=mode, seed=seed),
            duration_s,
        )
        for mode, seed in (("constant", 0), ("poisson", 0), ("poisson", 1))
    ]
    checked: list[SizeCheck] = []

    def check(n: int) -> SizeCheck:
        share = replace(scenario, rate=scenario.rate / n)
        found = quick_tune(
            share, max_workers=max_workers, max_batch_size=max_batch_size, waits_s=waits_s
        )
        ev = None
        if found.best is not None:
            ev = evaluate_fleet(
                found.best.setting, scenario, schedules, replicas=n, routing=routing
            )
        result = SizeCheck(replicas=n, evaluation=ev)
        checked.append(result)
        return result

    def plan(hit: SizeCheck | None) -> FleetPlan:
        return FleetPlan(
            scenario=scenario,
            routing=routing,
            max_replicas=max_replicas,
            replicas=hit.replicas if hit else None,
            best=hit.evaluation if hit else None,
            checked=tuple(checked),
        )

    bound = rate_bound(scenario, max_workers=max_workers)
    if bound <= 0.0:
        return plan(None)
    n = max(1, math.ceil(scenario.rate / bound)) if math.isfinite(bound) else 1
    failed = n - 1
    hit: SizeCheck | None = None
    while n <= max_replicas:
        c = check(n)
        if c.meets:
            hit = c
            break
        failed = n
        n = min(2 * n, max_replicas) if n < max_replicas else max_replicas + 1
    if hit is None:
        return plan(None)
    lo, hi = failed, hit.replicas
    while hi - lo > 1:
        mid = (lo + hi) // 2
        c = check(mid)
        if c.meets:
            hi, hit = mid, c
        else:
            lo = mid
    return plan(hit)
