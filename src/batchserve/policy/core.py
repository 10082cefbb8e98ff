"""The batching policy: a pure state machine with no I/O and no clock of its own.

Theory of operation
-------------------
State: a FIFO queue of live entries (at most ``queue_size``), a heap of their deadlines, the
batches dispatched (at most ``workers`` running, and with ``prefetch`` at most ``workers``
more to begin next) with a heap of their entries' deadlines, outcome counters and the cost
model. Every deadline, queued or dispatched, is the policy's to track and the driver's to fire.

Events, each handed the current time ``now`` by the driver:

* ``offer(now, payload, deadline)`` admits an item or raises a :class:`~batchserve.errors.Rejected`
  at once: ``ShuttingDown`` when closed, ``QueueFull`` when the queue holds ``queue_size``
  live items, ``DeadlineInfeasible`` when admission is on and the cost model predicts the
  item would finish after its deadline (with a margin: two standard errors of the passes
  ahead, from the cost model's own prediction error, plus 2% of the predicted wait), or
  when it would make an earlier item of its batch late (it joins the pass of the last
  queued items and makes it longer). Nothing is ever queued to be refused later. One
  exception keeps the belief honest: when nothing is queued, a worker is idle and the cost
  model has measured at least one pass, the item is admitted as a probe whatever the
  prediction, so a model that was stuck or slow and has recovered is measured again instead
  of being refused forever.
* ``screen(now, deadline)`` asks the same question as ``offer`` for one more item before
  the item exists (a server refusing a request from its head, before reading its body): it
  returns the refusal, counted as one refused item, or None and changes nothing. An
  ``offer`` that follows a passed screen with the same deadline, while no other event has
  changed the policy and within the slack the screen found, takes its verdict instead of
  predicting again (the prediction can only have moved by the time that passed): a server
  that screens each request's head and offers its body pays for one prediction, not two.
* ``cancel(now, entry)`` removes a queued entry (its caller left). A running entry is only
  marked, so the driver can skip it just before the forward pass.
* ``poll(now)`` returns the actions due now: entries whose deadline has passed while queued
  (``expired``, in deadline order), running entries whose deadline has passed during their
  pass (``late``: marked withdrawn, to be answered now; a pass not yet begun skips them), then
  batches to dispatch, and ``wake_at``: the time the driver must call ``poll`` again if
  nothing else happens first (the next max wait, queued deadline or running deadline).
  With ``prefetch``, while every worker is busy a batch that can no longer grow (full, or
  the policy draining) is dispatched too, one per worker: the driver queues it behind the
  running passes, so it begins the moment one ends instead of after the driver has heard
  of the end and handed the next batch over (an idle gap per pass under sustained load).
  Admission predicts it as the pass that follows the first to end; an entry whose deadline
  passes before its prefetched pass begins is ``expired``, as in the queue.
* ``finish(now, batch, ...)`` ends a forward pass: the worker is free (and begins the oldest
  prefetched batch, whose ``start`` becomes ``now``), each entry gets its outcome, the cost
  model learns the pass's duration.

Invariants: a batch never holds more than ``max_batch_size`` entries; an entry is dispatched
at most once and never after its deadline; a batch is dispatched only while a worker is
free, when it is full or the oldest queued entry has waited ``max_wait_s`` (or at once while
draining, as nothing more will arrive), or prefetched as above; the first ``workers``
dispatched batches not yet finished are the running ones, in dispatch order; each entry
reaches exactly one outcome.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Collection
from typing import Generic

from batchserve.config import BatchConfig
from batchserve.costmodel import CostModel
from batchserve.errors import DeadlineInfeasible, QueueFull, Rejected, ShuttingDown
from batchserve.policy.admission import drain_rate, predict_finish_at, workers_free_at
from batchserve.policy.entries import (
    DONE,
    PREFETCHED,
    QUEUED,
    RUNNING,
    Actions,
    Batch,
    Entry,
    PayloadT,
)
from batchserve.policy.outcomes import PolicyStats, Tally, tally_pass

__all__ = ["DONE", "QUEUED", "RUNNING", "Batch", "Entry", "Policy", "Actions"]

_MIN_RETRY_S = 0.001
_DRIFT_MARGIN = 0.02


class _Verdicts:
    """The policy's cached verdicts: each is reused while ``Policy._changes`` is unchanged.

    Attributes:
        screened_at: ``_changes`` when the last screen passed (-1: none).
        screened_deadline: the deadline it passed for.
        screened_until: the time until which its verdict holds.
        fits_until: written by ``_refusal`` when a prediction fits: until when it does.
        steady_until: written by ``predict_finish``: until when the prediction moves no
            faster than the clock.
        retry_at: ``_changes`` when ``retry_after`` was last computed (-1: never).
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


class Policy(Generic[PayloadT]):
    """The batching state machine. See the module docstring for its theory of operation.

    Args:
        config: batch size, max wait, queue size, workers, admission, starting cost estimate.
        cost_model: the cost model to use; by default one starting from
            ``config.initial_cost``.
    """

    def __init__(self, config: BatchConfig, cost_model: CostModel | None = None) -> None:
        self.config = config
        self.cost_model = cost_model if cost_model is not None else CostModel(config.initial_cost)
        self._queue: OrderedDict[int, Entry[PayloadT]] = OrderedDict()
        # The earliest deadline among the queue's last ``len % max_batch_size`` entries (the
        # part-full batch a new item would join), kept as items join; None: recompute it
        # (an entry left from the middle, so the batches' boundaries moved).
        self._tail_min: float | None = math.inf
        self._deadlines: list[tuple[float, int, Entry[PayloadT]]] = []
        self._running: dict[int, Batch[PayloadT]] = {}
        self._running_deadlines: list[tuple[float, int, Entry[PayloadT]]] = []
        self._ids = itertools.count()
        self._batch_ids = itertools.count()
        self._draining = False
        self._prefetch = config.prefetch
        # The depth from which the next pass is settled (no arrival can change it): full.
        self._settled_depth = config.max_batch_size
        self._tally = Tally()
        self._batches = 0
        self._batch_sizes: dict[int, int] = {}
        self._bisect_calls = 0
        # Bumped by every event that can change admission's verdict (offer, cancel, poll
        # that expires or dispatches, finish, close); a passed screen is reused by the next
        # offer only while it is unchanged (see ``screen``).
        self._changes = 0
        self._verdicts = _Verdicts()
        # Predicted seconds of each dispatched pass, by batch id, for a policy that predicts
        # a pass from its items (see ``_dispatched``); None: from the cost model by count.
        self._passes_s: dict[int, float] | None = None

    # -- queries ---------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Live entries waiting now."""
        return len(self._queue)

    @property
    def draining(self) -> bool:
        """Whether ``close`` was called."""
        return self._draining

    @property
    def idle(self) -> bool:
        """Nothing is queued or running."""
        return not self._queue and not self._running

    def queued(self, *, prefetched: bool = False) -> list[Entry[PayloadT]]:
        """Live queued entries, oldest first (a copy); ``prefetched``: prefetched ones first."""
        ahead = list(self._running.values())[self.config.workers :] if prefetched else ()
        return [e for b in ahead for e in b.entries if not e.withdrawn] + [*self._queue.values()]

    def statistics(self) -> PolicyStats:
        """A frozen snapshot of the counters, queue and cost model."""
        return PolicyStats(
            counters=self._tally.snapshot(),
            queue_depth=len(self._queue),
            running_items=sum(len(b.entries) for b in self._running.values()),
            running_batches=len(self._running),
            batches=self._batches,
            batch_sizes=dict(sorted(self._batch_sizes.items())),
            bisect_calls=self._bisect_calls,
            cost=self.cost_model.estimate,
            cost_samples=self.cost_model.samples,
            draining=self._draining,
        )

    def retry_after(self, now: float, reason: str) -> float:
        """Seconds after which a refused item could be admitted, from the queue and drain rate.

        ``queue_full``: the time to clear one batch from the queue; ``draining``: the time to
        clear the whole queue (this replica is going away); ``infeasible`` is computed by
        ``offer`` from the predicted lateness.
        """
        verdicts = self._verdicts
        if verdicts.retry_at == self._changes and verdicts.retry_reason == reason:
            return verdicts.retry_s  # nothing changed since it was computed (it reads no clock)
        cfg = self.config
        fixed_s, per_item_s = self._costs()
        rate = drain_rate(
            queue_depth=len(self._queue),
            workers=cfg.workers,
            max_batch_size=cfg.max_batch_size,
            fixed_s=fixed_s,
            per_item_s=per_item_s,
        )
        if reason == "draining":
            items = len(self._queue) + sum(len(b.entries) for b in self._running.values())
        else:
            items = min(cfg.max_batch_size, len(self._queue))
        verdicts.retry_at, verdicts.retry_reason = self._changes, reason
        verdicts.retry_s = max(_MIN_RETRY_S, items / rate)
        return verdicts.retry_s

    def predict_finish(self, now: float) -> float:
        """When an item admitted now would finish, by the cost model."""
        # This runs for every admitted item: plain locals, positional calls, no copies.
        cfg = self.config
        fixed_s, per_item_s = self._costs()
        workers = cfg.workers
        running = self._running
        free, steady = workers_free_at(
            now, running.values(), workers, fixed_s, per_item_s, self._passes_s
        )
        queue = self._queue
        position = len(queue)
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
            0.0 if self._draining else cfg.max_wait_s,
            fixed_s,
            per_item_s,
        )

    # -- events ----------------------------------------------------------------------------

    def offer(
        self, now: float, payload: PayloadT, deadline: float | None = None, size: int = 1
    ) -> Entry[PayloadT]:
        """Admit an item or refuse it at once.

        Args:
            now: the current time.
            payload: the driver's data for this item.
            deadline: absolute time by which the item must finish, or None.
            size: its tokens (read by a policy that forms batches by tokens).

        Returns:
            The queued entry.

        Raises:
            ShuttingDown: the policy is closed.
            QueueFull: ``queue_size`` items are waiting.
            DeadlineInfeasible: admission is on and the item is predicted to finish late
                (or its deadline has already passed).
        """
        tally = self._tally
        tally.received += 1
        verdicts = self._verdicts
        if (
            verdicts.screened_at != self._changes
            or deadline != verdicts.screened_deadline
            or now > verdicts.screened_until
        ):
            refusal = self._refusal(now, deadline)
            if refusal is not None:
                tally.rejected[refusal.reason] += 1
                raise refusal
        self._changes += 1
        entry: Entry[PayloadT] = Entry(next(self._ids), payload, now, deadline, size)
        queue = self._queue
        tail_min = self._tail_min
        if len(queue) % self.config.max_batch_size == 0:
            self._tail_min = math.inf if deadline is None else deadline
        elif tail_min is not None and deadline is not None and deadline < tail_min:
            self._tail_min = deadline
        queue[entry.id] = entry
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, entry.id, entry))
        tally.pending += 1
        return entry

    def screen(self, now: float, deadline: float | None) -> Rejected | None:
        """Whether one more item with ``deadline`` would be refused now (see ``offer``).

        Returns:
            The refusal, counted as one received and refused item; or None (nothing counted,
            nothing admitted: the item is offered later, when it exists).
        """
        verdicts = self._verdicts
        verdicts.fits_until = -math.inf
        refusal = self._refusal(now, deadline)
        if refusal is not None:
            self._tally.refuse(refusal.reason)
        elif deadline is not None:
            # Held for the offer of this item: with nothing changed, a later prediction is
            # at most later by the time passed (every term moves with ``now`` or stays), and
            # the margin can only shrink, so the verdict stands while ``now`` is within the
            # slack. Without a fitting prediction (no admission, a probe) it is reused only
            # at the very same ``now``.
            verdicts.screened_at = self._changes
            verdicts.screened_deadline = deadline
            verdicts.screened_until = max(now, verdicts.fits_until) if deadline > now else -math.inf
        return refusal

    def _refusal(self, now: float, deadline: float | None) -> Rejected | None:
        # The admission rule of ``offer`` and ``screen``; reads state, changes nothing.
        cfg = self.config
        queue = self._queue
        if self._draining:
            return ShuttingDown(
                "the batcher is shutting down and admits no new work",
                retry_after_s=self.retry_after(now, "draining"),
            )
        depth = len(queue)
        if depth >= cfg.queue_size:
            return QueueFull(
                f"queue is full: {depth} items waiting, queue_size is {cfg.queue_size}",
                retry_after_s=self.retry_after(now, "queue_full"),
            )
        if deadline is None or not (cfg.admission or deadline <= now):
            return None
        finish = now
        limit = bound = deadline
        if cfg.admission:
            finish = self.predict_finish(now)
            # A margin for the noise of a real machine: two standard errors of the passes
            # ahead, plus 2% of the predicted wait for drift the fit has not caught up with.
            margin = _DRIFT_MARGIN * (finish - now)
            spread = self._spread_s()
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
            if self._probe_ok(depth):
                return None
        whose = "its" if limit == deadline else "an earlier item of its batch's"
        return DeadlineInfeasible(
            f"deadline cannot be met: predicted to finish in {finish - now:.4f}s, "
            f"{whose} deadline is in {limit - now:.4f}s",
            retry_after_s=max(_MIN_RETRY_S, finish - limit),
        )

    def _costs(self) -> tuple[float, float]:
        """``(fixed_s, per_item_s)`` of a pass of the queued items, as admission predicts it."""
        est = self.cost_model.estimate
        return est.fixed_s, est.per_item_s

    def _spread_s(self) -> float:
        """The error of one pass's prediction, for admission's margin."""
        return self.cost_model.spread_s

    def _probe_ok(self, depth: int) -> bool:
        # A refusal on belief alone when nothing waits and a worker is idle would rest on a
        # cost model that nothing can correct: with nothing admitted nothing is measured, so
        # after a stuck or slow spell of the model the server would refuse forever. Such an
        # item is admitted as a probe (it only uses an idle worker) and its pass refreshes
        # the belief. A cost stated up front and never measured is trusted.
        return (
            depth == 0 and len(self._running) < self.config.workers and self.cost_model.samples > 0
        )

    def cancel(self, now: float, entry: Entry[PayloadT]) -> bool:
        """The caller of ``entry`` left.

        Returns:
            True if the entry was queued and is now counted ``cancelled``; False if it is
            running (it is marked, and ``finish`` counts it cancelled when the driver reports
            it skipped) or already done.
        """
        entry.withdrawn = True
        if entry.state != QUEUED:
            return False
        self._changes += 1
        del self._queue[entry.id]
        self._tail_min = None
        entry.state = DONE
        self._tally.cancelled += 1
        self._tally.pending -= 1
        return True

    def close(self) -> None:
        """Refuse every new item from now on; queued items still run, without max wait."""
        self._draining = True
        self._changes += 1

    def poll(self, now: float) -> Actions[PayloadT]:
        """Expire what is due, dispatch what may go, and say when to poll next."""
        deadlines = self._deadlines
        # Nothing can expire while the earliest deadline is ahead (stale heads are dropped
        # below).
        expired = self._expire(now) if deadlines and deadlines[0][0] <= now else []
        running_deadlines = self._running_deadlines
        late = (
            self._overdue(now, expired)
            if running_deadlines and running_deadlines[0][0] <= now
            else None
        )
        cfg = self.config
        dispatch: list[Batch[PayloadT]] = []
        queue = self._queue
        wake_at: float | None = None
        running = self._running
        while queue:
            state = RUNNING
            if len(running) >= cfg.workers:
                # Every worker is busy: a batch that can no longer grow is prefetched, one
                # per worker, to begin as soon as a running pass ends (see ``finish``).
                if not self._prefetch_due():
                    break
                state = PREFETCHED
            elif len(queue) < cfg.max_batch_size and not self._draining:
                due = self._due()
                if now < due:
                    wake_at = due
                    break
            entries = self._take(now, min(cfg.max_batch_size, len(queue)))
            for e in entries:
                e.state = state
                if e.deadline is not None:
                    heapq.heappush(running_deadlines, (e.deadline, e.id, e))
            batch = Batch(next(self._batch_ids), entries, now)
            running[batch.id] = batch
            dispatch.append(batch)
            self._dispatched(batch)
            self._changes += 1
        while deadlines and deadlines[0][2].state != QUEUED:
            heapq.heappop(deadlines)
        if deadlines:
            first = deadlines[0][0]
            wake_at = first if wake_at is None or first < wake_at else wake_at
        while running_deadlines and (
            running_deadlines[0][2].state == DONE or running_deadlines[0][2].withdrawn
        ):
            heapq.heappop(running_deadlines)
        if running_deadlines:
            first = running_deadlines[0][0]
            wake_at = first if wake_at is None or first < wake_at else wake_at
        return Actions(expired, dispatch, wake_at, late)

    def poll_due(self, now: float, wake_at: float) -> bool:
        """Whether ``poll(now)`` could do anything that a poll at ``wake_at`` would not.

        For a driver that has a poll due at ``wake_at`` (its timer) and has just offered an
        item: False means it may skip polling now (no worker is free to take a pass, or the
        queue waits for a max wait that the timer already covers, and no deadline falls
        before the timer). Conservative: True whenever unsure.
        """
        queue = self._queue
        cfg = self.config
        if queue and (
            self._prefetch_due()
            if len(self._running) >= cfg.workers
            else len(queue) >= cfg.max_batch_size or self._draining or self._due() < wake_at
        ):
            return True
        deadlines = self._deadlines
        if deadlines and deadlines[0][0] < wake_at:
            return True
        running = self._running_deadlines
        return bool(running) and running[0][0] < wake_at

    def _prefetch_due(self) -> bool:
        """Whether the next batch is settled and may be prefetched (see ``poll``)."""
        return (
            self._prefetch
            and len(self._running) < 2 * self.config.workers
            and (len(self._queue) >= self._settled_depth or self._draining)
        )

    def _due(self) -> float:
        """When the next pass must go though not full: the oldest item's max wait is up."""
        return next(iter(self._queue.values())).arrival + self.config.max_wait_s

    def _take(self, now: float, n: int) -> list[Entry[PayloadT]]:
        """The ``n`` items of the next pass, taken off the queue: the oldest first."""
        queue = self._queue
        return [queue.popitem(last=False)[1] for _ in range(n)]

    def _dispatched(self, batch: Batch[PayloadT]) -> None:
        """A batch was just dispatched (a hook: the plain policy has nothing to note)."""

    def _overdue(self, now: float, expired: list[Entry[PayloadT]]) -> list[Entry[PayloadT]]:
        # Dispatched entries whose deadline has passed, answered now: ``late`` if running;
        # if prefetched (pass not begun), ``expired`` as in the queue. Either is withdrawn:
        # a pass not yet begun skips it.
        heap = self._running_deadlines
        late: list[Entry[PayloadT]] = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.withdrawn:
                continue
            if entry.state == RUNNING:
                entry.withdrawn = True
                late.append(entry)
            elif entry.state == PREFETCHED:
                entry.withdrawn = True
                entry.state = DONE
                expired.append(entry)
                self._tally.expired += 1
                self._tally.pending -= 1
                self._changes += 1
        return late

    def _expire(self, now: float) -> list[Entry[PayloadT]]:
        heap = self._deadlines
        expired: list[Entry[PayloadT]] = []
        while heap:
            deadline, _, entry = heap[0]
            if entry.state != QUEUED:
                heapq.heappop(heap)
                continue
            if deadline > now:
                break
            heapq.heappop(heap)
            del self._queue[entry.id]
            self._tail_min = None
            entry.state = DONE
            expired.append(entry)
        self._changes += 1
        self._tally.expired += len(expired)
        self._tally.pending -= len(expired)
        return expired

    def finish(
        self,
        now: float,
        batch: Batch[PayloadT],
        *,
        failed: Collection[Entry[PayloadT]] = (),
        skipped: Collection[Entry[PayloadT]] = (),
        bisect_calls: int = 0,
    ) -> None:
        """End a forward pass and give each of its entries an outcome.

        Args:
            now: the current time.
            batch: the batch ``poll`` dispatched. The cost model learns the pass's
                dispatch-to-finish time, ``now - batch.start``, unless some entries failed
                (a bisected pass says nothing about the model's speed).
            failed: entries the model raised for (counted ``failed``).
            skipped: entries not run because their caller had left (counted ``cancelled``).
            bisect_calls: extra model calls spent isolating failures.
        """
        running = self._running
        if batch.id not in running:
            raise ValueError(f"batch {batch.id} is not running")
        workers = self.config.workers
        if len(running) > workers:
            # A prefetched batch begins on the worker this pass frees, now (its ``start``
            # was its dispatch; from now on it is the pass's start).
            ids = list(running)
            if ids.index(batch.id) < workers:
                begun = running[ids[workers]]
                begun.start = now
                for e in begun.entries:
                    if e.state == PREFETCHED:
                        e.state = RUNNING
        del running[batch.id]
        self._changes += 1
        ran = len(batch.entries) - len(skipped)
        if not failed and ran > 0:
            # The service time the policy saw, dispatch to finish: the forward pass plus the
            # driver's own overhead, which is what the queue behind this batch waits for.
            self.cost_model.observe(ran, now - batch.start)
        if ran > 0:
            self._batches += 1
            self._batch_sizes[ran] = self._batch_sizes.get(ran, 0) + 1
        self._bisect_calls += bisect_calls
        self._count_pass(now, batch.entries, failed, skipped)

    def _count_pass(
        self,
        now: float,
        entries: list[Entry[PayloadT]],
        failed: Collection[Entry[PayloadT]],
        skipped: Collection[Entry[PayloadT]],
    ) -> None:
        # The outcomes of a pass's entries, by the one rule of ``tally_pass``.
        self._tally.add_pass(*tally_pass(now, entries, failed, skipped))
