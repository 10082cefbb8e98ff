"""Choosing batching settings with the simulator: the most goodput within a p99 target.

Theory of operation
-------------------
A *setting* is ``(max_batch_size, max_wait_s, workers)``; the rest of the scenario (offered
rate, deadline, queue size, admission, the cost of a pass) is given. :func:`tune` searches a
grid of settings (:func:`candidate_grid`) in two rounds, both on the simulator, so the
search takes seconds:

1. **screen**: every setting on one short Poisson schedule;
2. **confirm**: the best few of the screen on several schedules (constant spacing and
   Poisson with several seeds, each longer), pooled: goodput is the mean, p99 the worst.

A setting is *feasible* when its p99 latency is within the target, and *meets the target*
when it is feasible and serves (answers ``ok``) at least ``1 - max_loss`` of what was sent;
refusing work to keep p99 low does not meet it. Among feasible settings the best serves the
most; settings within 0.5% of the most goodput count as equal, and among them the lowest p99
wins (p99 within 5% counts as equal, and then the fewest workers, the shortest wait and the
smallest batch win: the simplest setting that does as well).

When no setting meets the target, :func:`max_rate` bisects the offered rate for the highest
one at which some setting does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from batchserve.config import BatchConfig, CostEstimate, check_non_negative, check_positive
from batchserve.errors import ConfigError
from batchserve.sim.engine import simulate
from batchserve.workload.arrivals import arrival_times
from batchserve.workload.summary import LoadSummary, batch_label

__all__ = [
    "DEFAULT_WAITS_S",
    "Evaluation",
    "Scenario",
    "Setting",
    "TuneResult",
    "candidate_grid",
    "evaluate",
    "max_rate",
    "pool",
    "quick_tune",
    "rate_bound",
    "tune",
]

#: Max waits searched (those at or above the p99 target are left out).
DEFAULT_WAITS_S = (0.0, 0.0005, 0.001, 0.002, 0.005, 0.010, 0.020, 0.050, 0.100)
_GOODPUT_TIE = 0.005
_ZERO_COST = CostEstimate(fixed_s=0.0, per_item_s=0.0)
_P99_TIE = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """The batching settings searched.

    Attributes:
        max_batch_size: items per pass at most.
        max_wait_s: how long the oldest queued item may wait for a batch to fill.
        workers: passes at once.
    """

    max_batch_size: int
    max_wait_s: float
    workers: int = 1

    def flags(self) -> str:
        """The setting as ``serve`` flags."""
        wait = f"{self.max_wait_s * 1e3:g}ms"
        return f"--max-batch-size {self.max_batch_size} --max-wait {wait} --workers {self.workers}"

    def label(self) -> str:
        """A short label: ``batch<=8, wait 2ms`` (``, 2 workers`` when more than one)."""
        return batch_label(self.max_batch_size, self.max_wait_s, self.workers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """What is given: the load, the server's other settings and the model's cost.

    Attributes:
        rate: offered requests per second.
        p99_target_s: the p99 latency to stay within.
        cost: the true cost of a pass.
        timeout_s: each request's deadline (None: none).
        queue_size: the server's queue size.
        admission: whether the server refuses work predicted to miss its deadline.
        prefetch: whether the server prefetches the next full batch (``serve --prefetch``).
        initial_cost: where the server's cost model starts (zero: no profile given).
        max_loss: the share of requests that may go unserved while meeting the target.
        overhead_s: seconds the server adds to every pass (see :func:`simulate`).
    """

    rate: float
    p99_target_s: float
    cost: CostEstimate
    timeout_s: float | None = 0.25
    queue_size: int = 64
    admission: bool = True
    prefetch: bool = True
    initial_cost: CostEstimate = _ZERO_COST
    max_loss: float = 0.01
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        check_positive("rate", self.rate)
        check_positive("p99_target_s", self.p99_target_s)
        check_non_negative("overhead_s", self.overhead_s)
        if not 0.0 <= self.max_loss < 1.0:
            raise ConfigError(f"max_loss must be in [0, 1), got {self.max_loss!r}")

    def to_dict(self) -> dict[str, Any]:
        """The scenario as the JSON reports of ``tune`` and the fleet sizing print it."""
        return {
            "rate": self.rate,
            "p99_target_s": self.p99_target_s,
            "fixed_s": self.cost.fixed_s,
            "per_item_s": self.cost.per_item_s,
            "timeout_s": self.timeout_s,
            "queue_size": self.queue_size,
            "admission": self.admission,
            "prefetch": self.prefetch,
            "max_loss": self.max_loss,
            "overhead_s": self.overhead_s,
        }

    def serve_flags(self, setting: Setting) -> str:
        """``serve`` flags for the whole configuration the prediction assumed."""
        flags = f"{setting.flags()} --queue-size {self.queue_size}"
        if self.timeout_s is not None:
            flags += f" --timeout {self.timeout_s * 1e3:g}ms"
        if not self.admission:
            flags += " --admission off"
        if not self.prefetch:
            flags += " --prefetch off"
        return flags

    def config(self, setting: Setting) -> BatchConfig:
        """The server's whole configuration with ``setting``."""
        return BatchConfig(
            max_batch_size=setting.max_batch_size,
            max_wait_s=setting.max_wait_s,
            workers=setting.workers,
            queue_size=self.queue_size,
            admission=self.admission,
            prefetch=self.prefetch,
            initial_cost=self.initial_cost,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """A setting's predicted figures, pooled over the schedules it ran on.

    Attributes:
        setting: the setting.
        runs: schedules simulated.
        sent: requests sent, all runs.
        ok_per_s: mean successful requests per second.
        served: share of sent requests answered ok.
        avg_batch: mean items per pass.
        p50_ms: mean p50 latency.
        p99_ms: worst p99 latency.
        rejected: share refused at admission.
        timed_out: share expired in the queue or finished late.
        p99_target_ms: the target, for :attr:`feasible`.
        max_loss: the allowed unserved share, for :attr:`meets`.
    """

    setting: Setting
    runs: int
    sent: int
    ok_per_s: float
    served: float
    avg_batch: float
    p50_ms: float
    p99_ms: float
    rejected: float
    timed_out: float
    p99_target_ms: float
    max_loss: float

    @property
    def feasible(self) -> bool:
        """The p99 latency is within the target."""
        return self.served > 0 and self.p99_ms <= self.p99_target_ms

    @property
    def meets(self) -> bool:
        """Feasible, and serves at least ``1 - max_loss`` of what was sent."""
        return self.feasible and self.served >= 1.0 - self.max_loss

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "max_batch_size": self.setting.max_batch_size,
            "max_wait_s": self.setting.max_wait_s,
            "workers": self.setting.workers,
            "ok_per_s": round(self.ok_per_s, 3),
            "served": round(self.served, 5),
            "avg_batch": round(self.avg_batch, 3),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "rejected": round(self.rejected, 5),
            "timed_out": round(self.timed_out, 5),
            "feasible": self.feasible,
            "meets": self.meets,
            "runs": self.runs,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneResult:
    """What :func:`tune` found.

    Attributes:
        scenario: what was given.
        best: the chosen setting's evaluation; None if no setting is feasible.
        ranked: the confirmed settings, best first (feasible ones before the others).
        searched: settings screened.
        max_rate: when no setting meets the target, the highest rate at which one does
            (None when the target is met, or when it was not searched).
    """

    scenario: Scenario
    best: Evaluation | None
    ranked: tuple[Evaluation, ...]
    searched: int
    max_rate: float | None = None

    @property
    def met(self) -> bool:
        """Whether the best setting meets the target."""
        return self.best is not None and self.best.meets

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            **self.scenario.to_dict(),
            "met": self.met,
            "best": self.best.to_dict() if self.best else None,
            "candidates": [e.to_dict() for e in self.ranked],
            "searched": self.searched,
            "max_rate": self.max_rate,
        }


def candidate_grid(
    scenario: Scenario,
    *,
    max_workers: int = 4,
    max_batch_size: int = 256,
    waits_s: Sequence[float] = DEFAULT_WAITS_S,
) -> list[Setting]:
    """The settings to search.

    Batch sizes: powers of two up to ``max_batch_size`` (past what can arrive within two
    targets there is nothing to gain), plus for each worker count the smallest batch whose
    throughput keeps up with its share of the rate, and twice that. Waits: ``waits_s`` below
    the p99 target.
    """
    if max_workers < 1:
        raise ConfigError(f"max_workers must be >= 1, got {max_workers}")
    if max_batch_size < 1:
        raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
    rate, target = scenario.rate, scenario.p99_target_s
    fixed_s, per_item_s = scenario.cost.fixed_s + scenario.overhead_s, scenario.cost.per_item_s
    reach = max(1, math.ceil(2.0 * rate * target))
    sizes: set[int] = set()
    b = 1
    while b <= max_batch_size:
        sizes.add(b)
        if b >= reach:
            break
        b *= 2
    for w in range(1, max_workers + 1):
        share = rate / w
        spare = 1.0 - share * per_item_s
        if spare > 0:
            knee = max(1, math.ceil(share * fixed_s / spare))
            sizes.update(n for n in (knee, 2 * knee) if n <= max_batch_size)
    waits = sorted({w for w in waits_s if w < target})
    return [
        Setting(max_batch_size=n, max_wait_s=wait, workers=w)
        for w in range(1, max_workers + 1)
        for n in sorted(sizes)
        for wait in waits
    ]


def evaluate(
    setting: Setting, scenario: Scenario, schedules: Sequence[tuple[list[float], float]]
) -> Evaluation:
    """Simulate ``setting`` on each ``(arrivals, duration_s)`` schedule and pool the figures."""
    config = scenario.config(setting)
    summaries = [
        simulate(
            config=config,
            cost=scenario.cost,
            arrivals=arrivals,
            timeout_s=scenario.timeout_s,
            duration_s=duration_s,
            overhead_s=scenario.overhead_s,
        ).summary
        for arrivals, duration_s in schedules
    ]
    return pool(setting, scenario, summaries)


def pool(setting: Setting, scenario: Scenario, summaries: Sequence[LoadSummary]) -> Evaluation:
    """One :class:`Evaluation` from the summaries of ``setting``'s runs.

    Counts are summed, rates and medians averaged, and the p99 is the worst run's.
    """
    sent = sum(s.sent for s in summaries)
    ok = sum(s.ok for s in summaries)
    k = len(summaries)
    return Evaluation(
        setting=setting,
        runs=k,
        sent=sent,
        ok_per_s=sum(s.ok_per_s for s in summaries) / k,
        served=ok / sent if sent else 0.0,
        avg_batch=sum(s.avg_batch for s in summaries) / k,
        p50_ms=sum(s.p50_ms for s in summaries) / k,
        # A run with no success has no p99 (NaN): it is left out, as it always was.
        p99_ms=max((s.p99_ms for s in summaries if not math.isnan(s.p99_ms)), default=0.0),
        rejected=sum(s.rejected for s in summaries) / sent if sent else 0.0,
        timed_out=sum(s.timed_out for s in summaries) / sent if sent else 0.0,
        p99_target_ms=scenario.p99_target_s * 1e3,
        max_loss=scenario.max_loss,
    )


def _schedules(
    rate: float, duration_s: float, modes: Sequence[tuple[str, int]]
) -> list[tuple[list[float], float]]:
    return [
        (arrival_times(rate=rate, duration_s=duration_s, arrivals=mode, seed=seed), duration_s)
        for mode, seed in modes
    ]


def _rank(evals: Sequence[Evaluation]) -> list[Evaluation]:
    feasible = [e for e in evals if e.feasible]
    others = sorted((e for e in evals if not e.feasible), key=lambda e: (-e.served, e.p99_ms))
    if not feasible:
        return others
    most = max(e.served for e in feasible)
    tied = [e for e in feasible if e.served >= most * (1.0 - _GOODPUT_TIE)]
    low = min(e.p99_ms for e in tied)
    near = [e for e in tied if e.p99_ms <= low * (1.0 + _P99_TIE)]
    best = min(near, key=_simple)
    also_tied = sorted((e for e in tied if e is not best), key=lambda e: (e.p99_ms, _simple(e)))
    served_less = sorted(
        (e for e in feasible if e not in tied), key=lambda e: (-e.served, e.p99_ms, _simple(e))
    )
    return [best, *also_tied, *served_less, *others]


def _simple(e: Evaluation) -> tuple[int, float, int]:
    return (e.setting.workers, e.setting.max_wait_s, e.setting.max_batch_size)


def rate_bound(scenario: Scenario, *, max_workers: int = 4) -> float:
    """An upper bound on the rate any setting can serve within the p99 target.

    A pass must end within the target, so it holds at most ``n`` items where
    ``fixed_s + n * per_item_s <= p99_target_s``; ``max_workers`` such passes at once serve
    at most ``max_workers * n / (fixed_s + n * per_item_s)`` items per second. 0.0 when not
    even one item fits.
    """
    target = scenario.p99_target_s
    fixed_s, per_item_s = scenario.cost.fixed_s + scenario.overhead_s, scenario.cost.per_item_s
    if fixed_s + per_item_s > target:
        return 0.0
    # With no cost per item, any batch fits: a large one stands for "unbounded".
    n = math.floor((target - fixed_s) / per_item_s) if per_item_s > 0 else 1 << 30
    t = fixed_s + n * per_item_s
    return math.inf if t <= 0 else max_workers * n / t


def quick_tune(
    scenario: Scenario, *, max_workers: int, max_batch_size: int, waits_s: Sequence[float]
) -> TuneResult:
    """:func:`tune` with the short runs that a search over many scenarios affords.

    It answers whether a rate (or one replica's share of a fleet's rate) can be met at all.
    """
    return tune(
        scenario,
        max_workers=max_workers,
        max_batch_size=max_batch_size,
        waits_s=waits_s,
        screen_requests=400,
        confirm_requests=1000,
        confirm_seeds=1,
        keep=3,
        search_max_rate=False,
    )


def tune(
    scenario: Scenario,
    *,
    max_workers: int = 4,
    max_batch_size: int = 256,
    waits_s: Sequence[float] = DEFAULT_WAITS_S,
    screen_requests: int = 600,
    confirm_requests: int = 2000,
    confirm_seeds: int = 3,
    keep: int = 8,
    search_max_rate: bool = True,
) -> TuneResult:
    """Search the settings for the most goodput within the p99 target (see the module doc).

    Args:
        scenario: the load, the other server settings and the cost of a pass.
        max_workers: search 1 to this many workers.
        max_batch_size: the largest batch size searched.
        waits_s: the max waits searched (those at or above the target are skipped).
        screen_requests: requests per setting in the screening round (at least 0.5 s).
        confirm_requests: requests per schedule in the confirming round (at least 2 s).
        confirm_seeds: Poisson schedules in the confirming round, besides a constant one.
        keep: settings carried from the screen to the confirming round.
        search_max_rate: when no setting meets the target, bisect for the rate that can be.

    Returns:
        The best setting, the confirmed ranking, and the rate that could be met if the
        target cannot.
    """
    grid = candidate_grid(
        scenario, max_workers=max_workers, max_batch_size=max_batch_size, waits_s=waits_s
    )
    if rate_bound(scenario, max_workers=max_workers) == 0.0:
        # Not one pass of one item fits in the target: nothing to search.
        return TuneResult(scenario=scenario, best=None, ranked=(), searched=0, max_rate=0.0)
    rate = scenario.rate
    screen = _schedules(rate, max(0.5, screen_requests / rate), [("poisson", 1000)])
    screened = _rank([evaluate(s, scenario, screen) for s in grid])
    confirm_modes = [("constant", 0)] + [("poisson", seed) for seed in range(confirm_seeds)]
    confirm = _schedules(rate, max(2.0, confirm_requests / rate), confirm_modes)
    ranked = _rank([evaluate(e.setting, scenario, confirm) for e in screened[:keep]])
    best = ranked[0] if ranked and ranked[0].feasible else None
    found = TuneResult(scenario=scenario, best=best, ranked=tuple(ranked), searched=len(grid))
    if found.met or not search_max_rate:
        return found
    top = max_rate(
        scenario,
        max_workers=max_workers,
        max_batch_size=max_batch_size,
        waits_s=waits_s,
    )
    return replace(found, max_rate=top)


def max_rate(
    scenario: Scenario,
    *,
    max_workers: int = 4,
    max_batch_size: int = 256,
    waits_s: Sequence[float] = DEFAULT_WAITS_S,
    steps: int = 6,
) -> float:
    """The highest offered rate some setting meets, to within ``1/2**steps`` of the bound.

    The bound is the lower of ``scenario.rate`` and :func:`rate_bound`. Bisects between 0
    and it with a lighter search at each step (one screening schedule, then the best few
    confirmed on two more), then checks the rate found with the full search of :func:`tune`
    and lowers it by 3% at a time (at most 5 times) until that search meets it too, so
    that ``tune`` at the rate returned says "met". Returns 0.0 when the target is below the
    cost of one pass of one item, or when no rate tried can be met.
    """
    lo, hi = 0.0, min(scenario.rate, rate_bound(scenario, max_workers=max_workers))
    if hi <= 0.0:
        return 0.0
    for _ in range(steps):
        mid = (lo + hi) / 2.0
        probe = replace(scenario, rate=mid)
        result = quick_tune(
            probe, max_workers=max_workers, max_batch_size=max_batch_size, waits_s=waits_s
        )
        if result.met:
            lo = mid
        else:
            hi = mid
    for _ in range(5):
        if lo <= 0.0:
            break
        full = tune(
            replace(scenario, rate=lo),
            max_workers=max_workers,
            max_batch_size=max_batch_size,
            waits_s=waits_s,
            search_max_rate=False,
        )
        if full.met:
            return lo
        lo *= 0.97
    return 0.0
