"""Pure predictions used at admission: when would a new item finish, when to retry.

These functions read nothing but their arguments. ``predict_finish_at`` replays the batches the
queue will form, in order, on the workers as they come free, with the cost model's
``t(n) = fixed + n * per_item``; the batch holding the new item is dispatched no earlier than
its oldest item's arrival plus ``max_wait_s`` when it is not full (an upper bound: more
arrivals could fill it sooner).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from typing import Any

from batchserve.policy.entries import Batch

__all__ = [
    "DRIFT_MARGIN",
    "MIN_RETRY_S",
    "Verdicts",
    "drain_rate",
    "predict_finish_at",
    "workers_free_at",
]

#: The shortest ``Retry-After`` a refusal carries, in seconds.
MIN_RETRY_S = 0.001
#: Admission's margin for drift the cost model's fit has not caught up with: this fraction
#: of the predicted wait.
DRIFT_MARGIN = 0.02


class Verdicts:
    """Admission's cached verdicts: each is reused while the policy's changes are unchanged.

    Attributes:
        screened_at: the policy's change count when the last screen passed (-1: none).
        screened_deadline: the deadline it passed for.
        screened_until: the time until which its verdict holds.
        fits_until: written by a discipline's refusal when a prediction fits: until when
            it does.
        steady_until: written by a prediction: until when it moves no faster than the clock.
        retry_at: the change count when ``retry_after`` was last computed (-1: never).
        retry_reason: the reason it was computed for.
        retry_s: its value.
    """

    __slots__ = (
        "fits_until",
        "retry_at",
        "retry_reason",
        "retry_s",
        "screened_at",
        "screened_deadline",
        "screened_until",
        "steady_until",
    )

    def __init__(self) -> None:
        self.screened_at = -1
        self.screened_deadline: float | None = None
        self.screened_until = -math.inf
        self.fits_until = -math.inf
        self.steady_until = math.inf
        self.retry_at = -1
        self.retry_reason = ""
        self.retry_s = 0.0


def predict_finish_at(
    now: float,
    position: int,
    oldest_arrival: float,
    worker_free_at: list[float],
    max_batch_size: int,
    max_wait_s: float,
    fixed_s: float,
    per_item_s: float,
    /,
) -> float:
    """When the item at ``position`` (0 = head) of the queue finishes its pass.

    Positional arguments, for the policy's hot path: ``now``; the item's 0-based
    ``position`` among the live queued items; ``oldest_arrival``, the arrival of the item
    that opens its batch if that batch is not full (the max-wait bound); for each worker,
    when it is predicted to be free (<= ``now`` if idle); ``max_batch_size``;
    ``max_wait_s``; and the cost ``fixed_s + n * per_item_s`` of a pass of ``n`` items.
    """
    # Runs for every admitted item: conditionals rather than max() and divmod().
    b = max_batch_size
    if position < b:
        full_ahead = 0
        size = position + 1
    else:
        # Behind a full batch the load is such that the item's batch fills up too before a
        # worker takes it: predict it full, so that later items joining it do not make it
        # later than this prediction (which would refuse them, and leave the batch part-full).
        full_ahead = position // b
        size = b
    last_ready = now
    if size < b:
        ready = oldest_arrival + max_wait_s
        if ready > now:
            last_ready = ready
    last_cost = fixed_s + size * per_item_s
    if len(worker_free_at) == 1:
        start = worker_free_at[0]
        if start < now:
            start = now
        if full_ahead:
            start += full_ahead * (fixed_s + b * per_item_s)
        if start < last_ready:
            start = last_ready
        return start + last_cost
    full_cost = fixed_s + b * per_item_s
    free = [t if t > now else now for t in worker_free_at]
    heapq.heapify(free)
    for _ in range(full_ahead):
        heapq.heapreplace(free, free[0] + full_cost)
    return max(free[0], last_ready) + last_cost


def workers_free_at(
    now: float,
    running: Iterable[Batch[Any]],
    workers: int,
    fixed_s: float,
    per_item_s: float,
    passes_s: Mapping[int, float] | None = None,
    /,
) -> tuple[list[float], float]:
    """When each worker is predicted to be free, and until when that prediction is steady.

    ``running``: the dispatched batches in dispatch order; the first ``workers`` are the
    passes under way (the rest, prefetched, are not read). A worker is free ``now`` if idle,
    else at its pass's predicted end: ``passes_s[batch.id]`` seconds after its start when
    given (a policy that predicted that pass from its items), else ``fixed_s + n *
    per_item_s``. The second value is the earliest such end (``inf`` when none runs): until
    then the prediction moves no faster than the clock.
    """
    free = [now] * workers
    steady = math.inf
    for i, batch in enumerate(running):
        if i == workers:
            break
        start = batch.start
        took = passes_s.get(batch.id) if passes_s is not None else None
        if took is None:
            took = fixed_s + len(batch.entries) * per_item_s
        expected = start + took
        if expected >= now:
            free[i] = expected
            if expected < steady:
                steady = expected
        else:
            # A pass already over its prediction is assumed to last as long again as it
            # has run so far: a stuck model makes admission stricter, not optimistic.
            free[i] = now + (now - start)
            steady = now
    return free, steady


def drain_rate(
    *, queue_depth: int, workers: int, max_batch_size: int, fixed_s: float, per_item_s: float
) -> float:
    """Items per second the workers clear at the batch size the queue supports.

    Returns ``math.inf`` when the cost model predicts free passes (no measurement yet).
    """
    n = max(1, min(max_batch_size, queue_depth))
    t = fixed_s + n * per_item_s
    return math.inf if t <= 0 else workers * n / t
