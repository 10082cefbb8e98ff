"""Pure predictions used at admission: when would a new item finish, when to retry.

These functions read nothing but their arguments. ``predict_finish`` replays the batches the
queue will form, in order, on the workers as they come free, with the cost model's
``t(n) = fixed + n * per_item``; the batch holding the new item is dispatched no earlier than
its oldest item's arrival plus ``max_wait_s`` when it is not full (an upper bound: more
arrivals could fill it sooner).
"""

from __future__ import annotations

import heapq
import math

from batchserve.config import CostEstimate

__all__ = ["drain_rate", "predict_finish"]


def predict_finish(
    *,
    now: float,
    position: int,
    head_arrival: float,
    tail_arrival: float,
    worker_free_at: list[float],
    max_batch_size: int,
    max_wait_s: float,
    cost: CostEstimate,
) -> float:
    """Predict when the item at ``position`` (0 = head) of the queue finishes its pass.

    Args:
        now: the current time.
        position: 0-based place of the item in the queue of live items.
        head_arrival: arrival time of the item that will open the item's batch, if it is not
            full (used for the max-wait bound).
        tail_arrival: arrival time of the new item itself.
        worker_free_at: for each worker, when it is predicted to be free (<= now if idle).
        max_batch_size: items per batch.
        max_wait_s: the batch's max wait.
        cost: the cost model.

    Returns:
        The predicted finish time of the item's forward pass.
    """
    b = max_batch_size
    full_ahead = position // b
    size = position % b + 1
    last_ready = now
    if size < b:
        last_ready = max(now, min(head_arrival, tail_arrival) + max_wait_s)
    full_cost = cost.fixed_s + b * cost.per_item_s
    last_cost = cost.fixed_s + size * cost.per_item_s
    free = [max(now, t) for t in worker_free_at]
    if len(free) == 1:
        start = max(free[0] + full_ahead * full_cost, last_ready)
        return start + last_cost
    heapq.heapify(free)
    for _ in range(full_ahead):
        heapq.heapreplace(free, free[0] + full_cost)
    return max(free[0], last_ready) + last_cost


def drain_rate(*, queue_depth: int, workers: int, max_batch_size: int, cost: CostEstimate) -> float:
    """Items per second the workers clear at the batch size the queue supports.

    Returns ``math.inf`` when the cost model predicts free passes (no measurement yet).
    """
    n = max(1, min(max_batch_size, queue_depth))
    t = cost.fixed_s + n * cost.per_item_s
    return math.inf if t <= 0 else workers * n / t
