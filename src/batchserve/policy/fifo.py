"""One queue, oldest first: the discipline of a policy without classes of work.

Theory of operation
-------------------
Every live queued entry waits in the policy's one queue, in arrival order, and a pass takes
the oldest. With a pricing that groups (passes by tokens), the oldest always goes and the
rest of the pass is chosen among the oldest ``length_window * max_batch_size`` items, oldest
first, each joining only if the pricing's group takes it (see
:mod:`batchserve.policy.tokens`); by count, the pass is the oldest ``n``.

Admission places a new item at the back of the queue: it finishes when the batches ahead of
it have run on the workers as they come free, and its own batch after it (with the margin
and the batchmates' rule of :mod:`batchserve.policy.core`'s docstring). The earliest deadline
among the part-full batch a new item would join is kept as items join, so the batchmates'
rule costs nothing per admission until an entry leaves from the middle of the queue.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Collection
from typing import Generic

from batchserve.config import BatchConfig
from batchserve.errors import ConfigError, DeadlineInfeasible, QueueFull, Rejected, ShuttingDown
from batchserve.policy.admission import (
    DRIFT_MARGIN,
    MIN_RETRY_S,
    Verdicts,
    predict_finish_at,
    workers_free_at,
)
from batchserve.policy.classes import WorkClass
from batchserve.policy.entries import Batch, Entry, PayloadT
from batchserve.policy.outcomes import Counters, Tally, tally_pass
from batchserve.policy.parts import Group, Host, Pricing

__all__ = ["Fifo"]


class Fifo(Generic[PayloadT]):
    """The one-queue discipline (see the module docstring).

    Args:
        host: the policy it serves.
        config: the policy's settings.
        queue: the policy's queue of every live queued entry, in arrival order.
        running: the policy's dispatched batches, in dispatch order.
        pricing: the policy's pricing.
        verdicts: the policy's cached verdicts (this discipline writes ``fits_until`` and
            ``steady_until``).
    """

    name = "fifo"
    prefetches = True
    caches_screens = True

    def __init__(
        self,
        host: Host,
        config: BatchConfig,
        queue: OrderedDict[int, Entry[PayloadT]],
        running: dict[int, Batch[PayloadT]],
        pricing: Pricing[PayloadT],
        verdicts: Verdicts,
    ) -> None:
        self._host = host
        self._config = config
        self._queue = queue
        self._running = running
        self._pricing = pricing
        self._verdicts = verdicts
        # Called at every admission: bound once (the policy's, which a subclass may wrap).
        self._predict = host.predict_finish
        # The earliest deadline among the queue's last ``len % max_batch_size`` entries (the
        # part-full batch a new item would join), kept as items join; None: recompute it
        # (an entry left from the middle, so the batches' boundaries moved).
        self._tail_min: float | None = math.inf

    def resolve(self, priority: str | int | None) -> WorkClass | None:
        """None: one queue has no classes.

        Raises:
            ConfigError: a priority is given all the same.
        """
        if priority is not None:
            raise ConfigError(f"priority {priority!r} given, but the batcher has no classes")
        return None

    def refusal(
        self,
        now: float,
        deadline: float | None,
        work_class: str | None = None,
        tenant: str | None = None,
        offered: bool = False,
    ) -> Rejected | None:
        """Whether one more item would be refused now.

        ``work_class`` and ``tenant`` are not read: one queue serves everyone.
        """
        cfg = self._config
        queue = self._queue
        host = self._host
        if host.draining:
            return ShuttingDown(
                "the batcher is shutting down and admits no new work",
                retry_after_s=host.retry_after(now, "draining"),
            )
        depth = len(queue)
        if depth >= cfg.queue_size:
            return QueueFull(
                f"queue is full: {depth} items waiting, queue_size is {cfg.queue_size}",
                retry_after_s=host.retry_after(now, "queue_full"),
            )
        if deadline is None or not (cfg.admission or deadline <= now):
            return None
        finish = now
        limit = bound = deadline
        if cfg.admission:
            finish = self._predict(now)
            # A margin for the noise of a real machine: two standard errors of the passes
            # ahead, plus 2% of the predicted wait for drift the fit has not caught up with.
            margin = DRIFT_MARGIN * (finish - now)
            spread = self._pricing.spread_s()
            if spread:
                passes = depth // cfg.max_batch_size + 1 + len(self._running)
                margin += 2.0 * spread * math.sqrt(passes)
            finish += margin
            # The item joins the batch of the last ``k`` queued items, whose pass it makes
            # longer: it must not make any of them late either.
            k = depth % cfg.max_batch_size
            if k and finish <= deadline:
                tail_min = self._tail_min
                if tail_min is None:
                    mates = itertools.islice(reversed(queue.values()), k)
                    tail_min = self._tail_min = min(
                        (m.deadline for m in mates if m.deadline is not None), default=math.inf
                    )
                if finish > tail_min:
                    limit = tail_min
                elif tail_min < bound:
                    bound = tail_min
        if deadline > now:
            if finish <= limit:
                # The verdict holds while the prediction stays within the tightest deadline
                # it was checked against, and no later than the first running pass's
                # predicted end: past it, the rule for overrunning passes makes it jump.
                fits = now + (bound - finish)
                verdicts = self._verdicts
                steady = verdicts.steady_until
                verdicts.fits_until = fits if fits < steady else steady
                return None
            if host.probe_ok(depth):
                return None
        whose = "its" if limit == deadline else "an earlier item of its batch's"
        return DeadlineInfeasible(
            f"deadline cannot be met: predicted to finish in {finish - now:.4f}s, "
            f"{whose} deadline is in {limit - now:.4f}s",
            retry_after_s=max(MIN_RETRY_S, finish - limit),
        )

    def predict_finish(self, now: float) -> float:
        """When an item admitted now would finish, by the pricing's costs."""
        # This runs for every admitted item: plain locals, positional calls, no copies.
        cfg = self._config
        queue = self._queue
        position = len(queue)
        pricing = self._pricing
        fixed_s, per_item_s = pricing.costs(position)
        workers = cfg.workers
        running = self._running
        free, steady = workers_free_at(
            now, running.values(), workers, fixed_s, per_item_s, pricing.passes_s
        )
        if len(running) > workers:
            # Prefetched batches (full, but for a draining policy's last) run next: they
            # are predicted as full batches at the head of the queue, as they were there.
            position += (len(running) - workers) * cfg.max_batch_size
        head = now
        if queue and position < cfg.max_batch_size:
            arrival = next(iter(queue.values())).arrival
            if arrival < now:
                head = arrival
        # Until then the prediction moves no faster than the clock (for ``screen``).
        self._verdicts.steady_until = steady
        return predict_finish_at(
            now,
            position,
            head,
            free,
            cfg.max_batch_size,
            0.0 if self._host.draining else cfg.max_wait_s,
            fixed_s,
            per_item_s,
        )

    def push(
        self,
        id: int,
        payload: PayloadT,
        now: float,
        deadline: float | None,
        size: int,
        work_class: str | None = None,
        tenant: str | None = None,
    ) -> Entry[PayloadT]:
        """A new entry at the back of the queue (the policy inserts it there)."""
        entry: Entry[PayloadT] = Entry(id, payload, now, deadline, size)
        tail_min = self._tail_min
        if len(self._queue) % self._config.max_batch_size == 0:
            self._tail_min = math.inf if deadline is None else deadline
        elif tail_min is not None and deadline is not None and deadline < tail_min:
            self._tail_min = deadline
        return entry

    def removed(self, entry: Entry[PayloadT], cancelled: bool) -> None:
        """An entry left from the middle: the batches' boundaries moved."""
        self._tail_min = None

    def expired_dispatched(self, entry: Entry[PayloadT]) -> None:
        """Nothing of its own to count."""

    def due(self) -> float:
        """When the oldest item's max wait is up."""
        return next(iter(self._queue.values())).arrival + self._config.max_wait_s

    def take(self, now: float, n: int, group: Group | None) -> list[Entry[PayloadT]]:
        """The oldest ``n``; with a group, the oldest and those of the window that join."""
        queue = self._queue
        if group is None:
            return [queue.popitem(last=False)[1] for _ in range(n)]
        cfg = self._config
        entries = iter(queue.values())
        head = next(entries)
        group.force(head.size)
        chosen = [head]
        if n > 1:
            for e in itertools.islice(entries, cfg.length_window * cfg.max_batch_size - 1):
                if group.joins(e.size):
                    chosen.append(e)
                    if len(chosen) == n:
                        break
        for e in chosen:
            del queue[e.id]
        self._tail_min = None  # the queue's batch boundaries moved
        return chosen

    def count_pass(
        self,
        now: float,
        tally: Tally,
        entries: list[Entry[PayloadT]],
        failed: Collection[Entry[PayloadT]],
        skipped: Collection[Entry[PayloadT]],
    ) -> None:
        """The outcomes of a pass's entries, by the one rule of ``tally_pass``."""
        tally.add_pass(*tally_pass(now, entries, failed, skipped))

    def class_statistics(self) -> dict[str, dict[str, Counters]]:
        """Empty: one queue has no classes."""
        return {}

    def class_depths(self) -> dict[str, int]:
        """Empty: one queue has no classes."""
        return {}
