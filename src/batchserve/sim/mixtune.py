"""Tuning for mixed traffic: the batch settings that serve the most within per-class targets.

:func:`tune_mix` searches max batch size and max wait on :func:`~batchserve.sim.mix.
simulate_mix` (the same classes policy the server runs) for a traffic mix of several
streams. A setting meets the targets when, for every class given a p99 target, the p99 of
its ok requests is within it and at most ``max_loss`` of its requests go unserved (refused
or timed out). Among those that meet them the most items per second served wins (a tie
within 0.5%: the smaller batch, then the shorter wait); when none meets them, the ranking
says by how much each missed (the worst ratio of p99 to target).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import ConfigError
from batchserve.policy import ClassConfig
from batchserve.sim.mix import MixResult, Stream, simulate_mix

__all__ = ["MixEvaluation", "MixTuneResult", "tune_mix"]

_WAITS_S = (0.0005, 0.001, 0.002, 0.005, 0.010, 0.020)
_TIE = 0.005


@dataclass(frozen=True, slots=True, kw_only=True)
class MixEvaluation:
    """One setting on the mix.

    Attributes:
        max_batch_size, max_wait_s: the setting.
        ok_per_s: items per second served, over every stream.
        p99_ms: each target class's p99 (ms) of ok requests, by class.
        loss: each target class's share of requests refused or timed out.
        worst: the largest p99/target ratio over the target classes.
        met: every target class within its p99 and ``max_loss``.
        result: the simulation.
    """

    max_batch_size: int
    max_wait_s: float
    ok_per_s: float
    p99_ms: dict[str, float]
    loss: dict[str, float]
    worst: float
    met: bool
    result: MixResult

    def to_dict(self) -> dict[str, Any]:
        """The setting and its figures; the streams' rows under ``streams``."""
        return {
            "max_batch_size": self.max_batch_size,
            "max_wait_s": self.max_wait_s,
            "ok_per_s": self.ok_per_s,
            "p99_ms": dict(self.p99_ms),
            "loss": dict(self.loss),
            "worst_p99_over_target": self.worst,
            "met": self.met,
            "streams": self.result.to_dicts(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class MixTuneResult:
    """What :func:`tune_mix` found.

    Attributes:
        targets_s: the p99 target of each class that has one.
        best: the best setting that meets the targets, or None.
        ranked: every setting, best first.
    """

    targets_s: dict[str, float]
    best: MixEvaluation | None
    ranked: tuple[MixEvaluation, ...]

    @property
    def met(self) -> bool:
        """Whether a setting meets every target."""
        return self.best is not None


def tune_mix(
    *,
    config: BatchConfig,
    cost: CostEstimate,
    streams: Sequence[Stream],
    classes: ClassConfig,
    targets_s: Mapping[str, float],
    duration_s: float = 3.0,
    max_loss: float = 0.01,
    max_batch_size: int = 256,
    waits_s: Sequence[float] = _WAITS_S,
    overhead_s: float = 0.0,
    timeout_s: float | None = None,
) -> MixTuneResult:
    """Search max batch size and max wait for the most goodput within per-class targets.

    Args:
        config: the server's other settings (queue size, workers, admission, starting cost).
        cost: the true cost of a pass.
        streams: the traffic mix.
        classes: the classes of work (their own max waits, when set, are kept).
        targets_s: p99 targets in seconds by class name (at least one).
        duration_s: the simulated schedule's length.
        max_loss: the share of a target class's requests that may go unserved.
        max_batch_size: the largest batch searched (powers of two from 1, and this).
        waits_s: the max waits searched.
        overhead_s: seconds the server adds to every pass.
        timeout_s: the deadline of a stream that states none and whose class has none (as
            :func:`~batchserve.sim.mix.simulate_mix` takes it).

    Raises:
        ConfigError: no target, a target for a class that does not exist, or a bad value.
    """
    if not targets_s:
        raise ConfigError("targets must name at least one class and its p99")
    for name, target in targets_s.items():
        if name not in classes.names:
            raise ConfigError(
                f"target class must be one of {', '.join(classes.names)}, got {name!r}"
            )
        if not target > 0:
            raise ConfigError(f"target of class {name} must be > 0, got {target!r}")
    if not 0 <= max_loss < 1:
        raise ConfigError(f"max_loss must be in [0, 1), got {max_loss!r}")
    sizes = sorted({*(2**k for k in range(int(math.log2(max_batch_size)) + 1)), max_batch_size})
    evals = []
    for n in sizes:
        for wait in waits_s:
            cfg = replace(config, max_batch_size=n, max_wait_s=wait)
            result = simulate_mix(
                config=cfg,
                cost=cost,
                streams=streams,
                duration_s=duration_s,
                classes=classes,
                overhead_s=overhead_s,
                timeout_s=timeout_s,
            )
            evals.append(_evaluate(n, wait, result, targets_s, max_loss))
    top = max((e.ok_per_s for e in evals if e.met), default=0.0)

    def key(e: MixEvaluation) -> tuple[Any, ...]:
        # Met first: those within 0.5% of the most goodput by the smaller batch and wait,
        # then the rest by goodput; among those that miss, the closest to the targets.
        if e.met:
            if e.ok_per_s >= top * (1 - _TIE):
                return (0, 0, e.max_batch_size, e.max_wait_s)
            return (0, 1, -e.ok_per_s, 0.0)
        return (1, e.worst, -e.ok_per_s, 0.0)

    ranked = sorted(evals, key=key)
    best = ranked[0] if ranked and ranked[0].met else None
    return MixTuneResult(targets_s=dict(targets_s), best=best, ranked=tuple(ranked))


def _evaluate(
    n: int, wait: float, result: MixResult, targets_s: Mapping[str, float], max_loss: float
) -> MixEvaluation:
    p99: dict[str, float] = {}
    loss: dict[str, float] = {}
    sent: dict[str, int] = {}
    lost: dict[str, int] = {}
    for f in result.streams:
        name = f.stream.work_class
        sent[name] = sent.get(name, 0) + f.sent
        lost[name] = lost.get(name, 0) + f.rejected_total + f.timed_out
        p99[name] = max(p99.get(name, 0.0), f.p99_ms)
    worst = 0.0
    met = True
    for name, target in targets_s.items():
        loss[name] = lost.get(name, 0) / sent[name] if sent.get(name) else 0.0
        ratio = p99.get(name, 0.0) / (target * 1e3)
        worst = max(worst, ratio)
        met = (
            met
            and ratio <= 1.0
            and loss[name] <= max_loss
            and sent.get(name, 0) > lost.get(name, 0)
        )
    return MixEvaluation(
        max_batch_size=n,
        max_wait_s=wait,
        ok_per_s=sum(f.ok_per_s for f in result.streams),
        p99_ms={k: v for k, v in p99.items() if k in targets_s},
        loss=loss,
        worst=worst,
        met=met,
        result=result,
    )
