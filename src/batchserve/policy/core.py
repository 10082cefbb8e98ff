"""The batching policy: a pure state machine with no I/O and no clock of its own.

Theory of operation
-------------------
One policy, composed of two parameters (:mod:`batchserve.policy.parts`): its queue's
**discipline**, one FIFO queue (:mod:`~batchserve.policy.fifo`, the default) or classes of
work and tenants (``classes``, :mod:`~batchserve.policy.mixed`), and its passes' **pricing**,
by count (the default) or by tokens with length-sorted sub-passes (``by_tokens``,
:mod:`~batchserve.policy.tokens`). Any discipline goes with any pricing. What follows is
the policy with one FIFO queue; the discipline of classes changes admission, when a pass is
due and which items it takes (its module says how), the pricing by tokens what a pass costs
and which items may share one.

State: a queue of live entries (at most ``queue_size``), a heap of their deadlines, the
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
from collections.abc import Callable, Collection
from typing import Generic

from batchserve.config import BatchConfig
from batchserve.costmodel import CostModel
from batchserve.errors import ConfigError, Rejected
from batchserve.policy.admission import MIN_RETRY_S, Verdicts, drain_rate
from batchserve.policy.classes import ClassConfig, WorkClass
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
from batchserve.policy.fifo import Fifo
from batchserve.policy.mixed import Classes
from batchserve.policy.outcomes import Counters, PolicyStats, Tally
from batchserve.policy.parts import ByCount, Discipline, Pricing
from batchserve.policy.tokens import ByTokens
from batchserve.subpasses import PassCost

__all__ = ["DONE", "QUEUED", "RUNNING", "Actions", "Batch", "Entry", "Policy", "make_policy"]


def make_policy(
    config: BatchConfig, *, sized: bool, classes: ClassConfig | None = None
) -> Policy[PayloadT]:
    """The policy ``config`` asks for: by tokens or by count, with ``classes`` or one queue.

    Args:
        config: the batcher's settings (``batch_by``).
        sized: whether the driver knows each item's tokens (``auto`` then means tokens).
        classes: the classes of work and tenants (None: one FIFO queue).

    Raises:
        ConfigError: ``batch_by`` is ``tokens`` (or ``max_batch_tokens`` is set) but the
            driver cannot size its items.
    """
    by = config.batch_by
    if by == "count" or (by == "auto" and not sized and config.max_batch_tokens is None):
        return Policy(config, classes=classes)
    if not sized:
        raise ConfigError(
            "batch_by tokens (or max_batch_tokens) needs a model that counts its inputs' "
            "tokens (a token_estimate method) or a sizer"
        )
    return Policy(config, classes=classes, by_tokens=True)


class Policy(Generic[PayloadT]):
    """The batching state machine. See the module docstring for its theory of operation.

    Args:
        config: batch size, max wait, queue size, workers, admission, starting cost estimate.
        cost_model: the cost model to use; by default one starting from
            ``config.initial_cost``.
        classes: the classes of work and tenants (None: one FIFO queue).
        by_tokens: form and price passes by tokens, as length-sorted sub-passes (each item
            is offered with its ``size`` in tokens).
        token_prior: with ``by_tokens``, the sub-pass cost the token model starts from
            (default: zero, which plans every distinct length as its own sub-pass).

    Attributes:
        config: the settings.
        cost_model: the cost of a pass by its items, learned from every pass.
        classes: the classes of work and tenants, or None.
        by_tokens: whether passes are formed and priced by tokens.
    """

    def __init__(
        self,
        config: BatchConfig,
        cost_model: CostModel | None = None,
        *,
        classes: ClassConfig | None = None,
        by_tokens: bool = False,
        token_prior: PassCost | None = None,
    ) -> None:
        self.config = config
        self.cost_model = cost_model if cost_model is not None else CostModel(config.initial_cost)
        self.classes = classes
        self._queue: OrderedDict[int, Entry[PayloadT]] = OrderedDict()
        self._deadlines: list[tuple[float, int, Entry[PayloadT]]] = []
        self._running: dict[int, Batch[PayloadT]] = {}
        self._running_deadlines: list[tuple[float, int, Entry[PayloadT]]] = []
        self._ids = itertools.count()
        self._batch_ids = itertools.count()
        self._draining = False
        self._tally = Tally()
        self._batches = 0
        self._batch_sizes: dict[int, int] = {}
        self._bisect_calls = 0
        # Bumped by every event that can change admission's verdict (offer, cancel, poll
        # that expires or dispatches, finish, close); a passed screen is reused by the next
        # offer only while it is unchanged (see ``screen``).
        self._changes = 0
        # The probe (``probe_ok``): ``_probe_at`` is ``_changes`` when the last item at the
        # head of an empty queue was admitted as one; ``_probing`` whether the queued items
        # ride on a probe (it heads the queue, and no pass has been dispatched since).
        self._probe_at = -1
        self._probing = False
        self._verdicts = Verdicts()
        self.by_tokens = by_tokens
        pricing: Pricing[PayloadT]
        if by_tokens:
            pricing = ByTokens(config, self.cost_model, token_prior)
        else:
            pricing = ByCount(self.cost_model, config.max_batch_size)
        self._pricing = pricing
        discipline: Discipline[PayloadT]
        if classes is None:
            discipline = Fifo(self, config, self._queue, self._running, pricing, self._verdicts)
        else:
            discipline = Classes(self, config, classes, self._queue, self._running, pricing)
        self._discipline = discipline
        # When the next pass must go though not full, asked at every poll: the discipline's
        # max wait, unless the pricing can find the queue full by its own measure (tokens).
        self._due: Callable[[], float] = self._full_or_due if pricing.fills else discipline.due
        self._prefetch = config.prefetch and discipline.prefetches
        # The depth from which the next pass is settled (no arrival can change it).
        self._settled_depth = pricing.settled_depth

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
            tokens=self._pricing.tokens(),
        )

    def class_statistics(self) -> dict[str, dict[str, Counters]]:
        """Outcome counters by class, then tenant label (empty without classes)."""
        return self._discipline.class_statistics()

    def class_depths(self) -> dict[str, int]:
        """Live entries of each class waiting now (empty without classes)."""
        return self._discipline.class_depths()

    def work_class(self, priority: str | int | None) -> WorkClass | None:
        """The class an item's ``priority`` names (a name, a level, or None: the default).

        None without classes, where a priority is refused.

        Raises:
            ConfigError: ``priority`` names no class, or is given without classes.
        """
        return self._discipline.resolve(priority)

    @property
    def discipline(self) -> str:
        """The queue's discipline: ``fifo`` (one queue) or ``classes``."""
        return self._discipline.name

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
        fixed_s, per_item_s = self._pricing.costs(len(self._queue))
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
        verdicts.retry_s = max(MIN_RETRY_S, items / rate)
        return verdicts.retry_s

    def predict_finish(self, now: float) -> float:
        """When an item (of the default class) admitted now would finish, by the pricing."""
        return self._discipline.predict_finish(now)

    def probe_ok(self, depth: int) -> bool:
        """Whether an item predicted late, with ``depth`` items queued, is admitted as a probe.

        A refusal on belief alone when nothing waits and a worker is idle would rest on a
        cost model that nothing can correct: with nothing admitted nothing is measured, so
        after a stuck or slow spell of the model the server would refuse forever. Such an
        item is admitted as a probe (it only uses an idle worker) and its pass refreshes
        the belief. A cost stated up front and never measured is trusted.
        """
        if len(self._running) >= self.config.workers or not self.cost_model.samples:
            return False
        if depth == 0:
            self._probe_at = self._changes
            return True
        # The items that join the probe's pass (it starts on the idle worker at once) ride
        # on it: a request of several items is admitted whole, its pass measured. Refusing
        # all but the first would refuse the request, withdraw the first, and leave the
        # belief that refused it with nothing to correct it.
        return self._probing and depth < self.config.max_batch_size

    # -- events ----------------------------------------------------------------------------

    def offer(
        self,
        now: float,
        payload: PayloadT,
        deadline: float | None = None,
        size: int = 1,
        *,
        work_class: str | None = None,
        tenant: str | None = None,
    ) -> Entry[PayloadT]:
        """Admit an item or refuse it at once.

        Args:
            now: the current time.
            payload: the driver's data for this item.
            deadline: absolute time by which the item must finish, or None.
            size: its tokens (read by a policy by tokens; below 1 it counts 1 there).
            work_class: its class of work (None: the default class); not read without
                classes.
            tenant: who it is for (fair shares and queue bounds among a class's tenants);
                not read without classes.

        Returns:
            The queued entry.

        Raises:
            ShuttingDown: the policy is closed.
            QueueFull: ``queue_size`` items are waiting (or the class's or tenant's share).
            DeadlineInfeasible: admission is on and the item is predicted to finish late
                (or its deadline has already passed).
            ConfigError: ``work_class`` names no class.
        """
        tally = self._tally
        verdicts = self._verdicts
        discipline = self._discipline
        if (
            verdicts.screened_at != self._changes
            or deadline != verdicts.screened_deadline
            or now > verdicts.screened_until
        ):
            self._probe_at = -1  # set again if this check admits a probe
            refusal = discipline.refusal(now, deadline, work_class, tenant, True)
            if refusal is not None:
                tally.received += 1
                tally.rejected[refusal.reason] += 1
                raise refusal
        tally.received += 1
        if not self._queue:
            # The head of the queue: a probe or not, the items behind it ride with it.
            self._probing = self._probe_at == self._changes
        self._changes += 1
        size = self._pricing.admit(size)
        entry = discipline.push(next(self._ids), payload, now, deadline, size, work_class, tenant)
        self._queue[entry.id] = entry
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, entry.id, entry))
        tally.pending += 1
        return entry

    def screen(
        self,
        now: float,
        deadline: float | None,
        work_class: str | None = None,
        tenant: str | None = None,
    ) -> Rejected | None:
        """Whether one more item with ``deadline`` would be refused now (see ``offer``).

        Returns:
            The refusal, counted as one received and refused item (of its class and
            tenant); or None (nothing counted, nothing admitted: the item is offered later,
            when it exists).

        Raises:
            ConfigError: ``work_class`` names no class.
        """
        verdicts = self._verdicts
        verdicts.fits_until = -math.inf
        discipline = self._discipline
        self._probe_at = -1  # set again if this check admits a probe
        refusal = discipline.refusal(now, deadline, work_class, tenant, False)
        if refusal is not None:
            self._tally.refuse(refusal.reason)
        elif deadline is not None and discipline.caches_screens:
            # Held for the offer of this item: with nothing changed, a later prediction is
            # at most later by the time passed (every term moves with ``now`` or stays), and
            # the margin can only shrink, so the verdict stands while ``now`` is within the
            # slack. Without a fitting prediction (no admission, a probe) it is reused only
            # at the very same ``now``.
            verdicts.screened_at = self._changes
            verdicts.screened_deadline = deadline
            verdicts.screened_until = max(now, verdicts.fits_until) if deadline > now else -math.inf
        return refusal

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
        self._discipline.removed(entry, True)
        self._pricing.left(entry)
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
        pricing = self._pricing
        group, taken, dispatched = pricing.group, pricing.taken, pricing.dispatched
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
            entries = self._discipline.take(now, min(cfg.max_batch_size, len(queue)), group())
            if not entries:
                break  # the discipline keeps the free workers (reserved): a finish re-polls
            taken(entries)
            for e in entries:
                e.state = state
                if e.deadline is not None:
                    heapq.heappush(running_deadlines, (e.deadline, e.id, e))
            batch = Batch(next(self._batch_ids), entries, now)
            running[batch.id] = batch
            self._probing = False
            dispatch.append(batch)
            dispatched(batch)
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

    def _full_or_due(self) -> float:
        """Now if the pricing says the queue holds a full pass, else the discipline's due."""
        if self._pricing.full():
            return -math.inf
        return self._discipline.due()

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
                self._discipline.expired_dispatched(entry)
                self._tally.expired += 1
                self._tally.pending -= 1
                self._changes += 1
        return late

    def _expire(self, now: float) -> list[Entry[PayloadT]]:
        heap = self._deadlines
        expired: list[Entry[PayloadT]] = []
        removed = self._discipline.removed
        left = self._pricing.left
        while heap:
            deadline, _, entry = heap[0]
            if entry.state != QUEUED:
                heapq.heappop(heap)
                continue
            if deadline > now:
                break
            heapq.heappop(heap)
            del self._queue[entry.id]
            removed(entry, False)
            left(entry)
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
        self._discipline.count_pass(now, self._tally, batch.entries, failed, skipped)
        self._pricing.finished(now, batch, failed, skipped)
