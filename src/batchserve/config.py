"""Small frozen, validated value objects that configure the batching engine.

Durations are float seconds and their names end in ``_s``. Every constructor validates its
fields and raises :class:`~batchserve.errors.ConfigError` naming the field, the rule and the
value, for example ``max_batch_size must be >= 1, got 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchserve.errors import ConfigError

__all__ = ["BATCH_BY", "BatchConfig", "CostEstimate", "check_positive", "check_non_negative"]

#: How a pass is formed: ``auto``, ``count`` or ``tokens`` (see :class:`BatchConfig`).
BATCH_BY = ("auto", "count", "tokens")


def _check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if math.isnan(value) or math.isinf(value):
        raise ConfigError(f"{name} must be finite, got {value!r}")
    return float(value)


def check_positive(name: str, value: object) -> float:
    """Return ``value`` as a float, or raise ConfigError unless it is a finite number > 0."""
    v = _check_number(name, value)
    if v <= 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")
    return v


def check_non_negative(name: str, value: object) -> float:
    """Return ``value`` as a float, or raise ConfigError unless it is a finite number >= 0."""
    v = _check_number(name, value)
    if v < 0:
        raise ConfigError(f"{name} must be >= 0, got {value!r}")
    return v


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CostEstimate:
    """A forward pass of ``n`` items costs ``fixed_s + n * per_item_s`` seconds.

    Attributes:
        fixed_s: cost paid once per forward pass, in seconds.
        per_item_s: extra cost of each item in the batch, in seconds.
    """

    fixed_s: float
    per_item_s: float

    def __post_init__(self) -> None:
        check_non_negative("fixed_s", self.fixed_s)
        check_non_negative("per_item_s", self.per_item_s)

    def cost(self, n: int) -> float:
        """Predicted seconds for one forward pass of ``n`` items."""
        return self.fixed_s + n * self.per_item_s


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchConfig:
    """How one batcher forms batches and admits work.

    Attributes:
        max_batch_size: a batch closes as soon as it holds this many items.
        max_wait_s: a batch closes when the OLDEST queued item has waited this long.
        queue_size: at most this many items wait; one more is refused at once (QueueFull).
        workers: forward passes that may run at the same time (model worker threads).
        admission: refuse at once an item the cost model predicts would miss its deadline.
        initial_cost: the cost model's starting estimate, used until batches are measured.
            The default (zero cost) admits everything until the first batch is measured.
        max_bisect_calls: when a batch raises, at most this many extra model calls are spent
            splitting it to find the failing inputs; past that the remaining inputs fail.
            The default (``None``) allows ``2 * len(batch)``, enough to isolate any failures.
        batch_by: ``count`` forms each pass from the oldest items, by count alone; ``tokens``
            forms it by tokens (a padded pass costs its longest item times its count): texts
            of similar length travel together and ``max_batch_tokens`` bounds a pass;
            ``auto`` (the default) is ``tokens`` when the model counts its inputs' tokens
            and ``count`` otherwise.
        max_batch_tokens: with batches by tokens, a pass holds at most this many padded
            tokens (its longest item times its count); one item longer than that still runs
            alone. None: only ``max_batch_size`` bounds a pass.
        length_window: with batches by tokens, a pass is chosen among the oldest
            ``length_window * max_batch_size`` queued items (it always holds the oldest).
        prefetch: while every worker is busy and a full batch waits (one that can no longer
            grow), hand it over at once, one per worker, so it begins the moment a running
            pass ends instead of after the driver has heard of the end: no idle gap between
            passes under sustained load. Below that load it changes nothing (no full batch
            waits while a pass runs).
    """

    max_batch_size: int = 32
    max_wait_s: float = 0.002
    queue_size: int = 1024
    workers: int = 1
    admission: bool = True
    initial_cost: CostEstimate = CostEstimate(fixed_s=0.0, per_item_s=0.0)
    max_bisect_calls: int | None = None
    batch_by: str = "auto"
    max_batch_tokens: int | None = None
    length_window: int = 4
    prefetch: bool = True

    def __post_init__(self) -> None:
        _check_int("max_batch_size", self.max_batch_size, 1)
        check_non_negative("max_wait_s", self.max_wait_s)
        _check_int("queue_size", self.queue_size, 1)
        _check_int("workers", self.workers, 1)
        if not isinstance(self.admission, bool):
            raise ConfigError(f"admission must be a bool, got {self.admission!r}")
        if not isinstance(self.initial_cost, CostEstimate):
            raise ConfigError(f"initial_cost must be a CostEstimate, got {self.initial_cost!r}")
        if self.max_bisect_calls is not None:
            _check_int("max_bisect_calls", self.max_bisect_calls, 0)
        if self.batch_by not in BATCH_BY:
            raise ConfigError(
                f"batch_by must be one of {', '.join(BATCH_BY)}, got {self.batch_by!r}"
            )
        if self.max_batch_tokens is not None:
            _check_int("max_batch_tokens", self.max_batch_tokens, 1)
            if self.batch_by == "count":
                raise ConfigError(
                    "max_batch_tokens needs batches by tokens: batch_by must be tokens or "
                    "auto, got 'count'"
                )
        _check_int("length_window", self.length_window, 1)
        if not isinstance(self.prefetch, bool):
            raise ConfigError(f"prefetch must be a bool, got {self.prefetch!r}")
