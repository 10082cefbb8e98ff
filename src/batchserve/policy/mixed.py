"""Classes of work and tenants: the discipline of a policy for mixed traffic.

Theory of operation
-------------------
:class:`Classes` is the discipline (:mod:`batchserve.policy.parts`) of a
:class:`~batchserve.policy.core.Policy` with one queue per class of work
(:class:`~batchserve.policy.lanes.ClassQueue`) instead of one FIFO queue. Everything about
running passes is the policy's, whatever its discipline: running deadlines, late answers,
``finish``'s outcomes, the pricing (by count or by tokens), draining. The single-class
server never builds one: it keeps the FIFO discipline and pays nothing for classes.

State: besides the policy's queue (every live queued entry, in arrival order, which keeps
its depth, idleness and expiry heap true), each entry sits in its class's queue and its
tenant's lane there (:class:`MixedEntry` knows its lane).

* ``offer(now, payload, deadline, size, work_class=..., tenant=...)`` admits an item of
  class ``work_class`` (a name; None: the default class) for ``tenant``, or refuses it at
  once. Refusals, in order: draining; the whole queue full; the class's queue share full;
  the tenant's share of the class full (named tenants only: a request with no tenant is not
  bounded by it); and, with admission on, a deadline the item cannot meet where it would
  wait: behind its own lane only, served at the rate its class's and tenant's shares give it
  in every pass. An interactive item is therefore judged by the interactive items ahead of
  it, never by the bulk queue, and ``Retry-After`` is the time for its own lane to move.
* ``poll(now)`` dispatches a batch while a worker is free and the batch is due: the queue
  holds ``max_batch_size`` items, or the oldest item of ANY class has waited that class's
  max wait, or the policy is draining. A batch of ``n`` items is filled in two rounds, in
  class order (most urgent first): first each class gets its weighted share ``n * weight /
  sum of queued classes' weights`` (plus the fraction of an item it was owed from earlier
  passes, and at least one item, so no class starves), then what is left goes to the classes
  in order. Within a class, tenants are served by deficit round robin. So an urgent item
  waits for at most the pass running now, whatever the bulk queue holds, and a request of
  many inputs is spread over several passes, beside the other classes' items, instead of
  filling one. With a pricing by tokens, an item joins only if the pricing's group takes it
  (see :mod:`batchserve.policy.tokens`), but each class's first item of the pass always
  joins: a class whose items do not join is owed them in the next pass. A pass is cut short
  when, by the pricing's costs (less two standard errors), a full one would end after the
  tightest deadline among the items already in it (earliest deadline first within the
  shares): the urgent item is not made late by the bulk items that would have filled the
  pass. Admission counts on this cut for an item whose own pass is the next one.
* **Reserved workers.** A class that reserves workers (``reserve=1``) has them kept
  for it: while a reserving class has items queued, the next pass holds only reserving
  classes' items (a query is never put in a pass beside bulk items that would make it
  wait), and a pass of the other classes is not formed while it would leave fewer than the
  reserve of workers free for them (running passes of reserving classes count as theirs).
  So a query waits for no bulk pass at all, at the price of bulk work running on
  ``workers - reserve`` workers. Admission still predicts as if every worker served every
  class (generous to bulk, strict to queries).
* Admission's view of the running passes differs from the plain policy's in one point: a
  pass over its prediction is assumed to overrun as much again (not to last as long again
  as it has run), so a pass a few milliseconds late on a busy machine does not refuse the
  queries behind it, while a stuck model still makes admission stricter as it goes on.
* ``cancel``, expiry and ``finish`` also update the class's queue and the tallies, so the
  outcome identity (received = outcomes + pending) holds for every class and tenant label.

Invariants (tested for every class): a batch holds at most ``max_batch_size`` entries, is
dispatched only while a worker is free, and each entry at most once and never after its
deadline; while a worker is free, no item waits past its class's max wait; each entry
reaches exactly one outcome, counted in its class and tenant label.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection
from typing import Generic

from batchserve.config import BatchConfig
from batchserve.errors import ConfigError, DeadlineInfeasible, QueueFull, Rejected, ShuttingDown
from batchserve.policy.admission import DRIFT_MARGIN, MIN_RETRY_S, predict_finish_at
from batchserve.policy.classes import ClassConfig, WorkClass
from batchserve.policy.entries import Batch, Entry, PayloadT
from batchserve.policy.lanes import ClassQueue, Lane
from batchserve.policy.outcomes import Counters, Tally, tally_pass
from batchserve.policy.parts import Group, Host, Pricing

__all__ = ["Classes", "MixedEntry"]


class MixedEntry(Entry[PayloadT], Generic[PayloadT]):
    """An admitted item of mixed traffic: an :class:`Entry` that knows its lane.

    Attributes:
        lane: its tenant's lane in its class's queue (``lane.owner`` is the class queue,
            ``lane.tally`` its counters).
    """

    __slots__ = ("lane",)

    def __init__(
        self,
        id: int,
        payload: PayloadT,
        arrival: float,
        deadline: float | None,
        lane: Lane,
        size: int = 1,
    ) -> None:
        super().__init__(id, payload, arrival, deadline, size)
        self.lane = lane


class Classes(Generic[PayloadT]):
    """The discipline of classes of work and tenants (see the module docstring).

    Args:
        host: the policy it serves.
        config: the policy's settings.
        classes: the classes of work and tenants.
        queue: the policy's queue of every live queued entry, in arrival order.
        running: the policy's dispatched batches, in dispatch order.
        pricing: the policy's pricing.

    Attributes:
        classes: the classes of work and tenants.
    """

    # No prefetch: a pass is formed when a worker takes it, so an urgent item that arrives
    # during a pass still rides the next one, not the one after.
    name = "classes"
    prefetches = False
    # A screen is judged for its class and tenant: the offer that follows is judged again.
    caches_screens = False

    def __init__(
        self,
        host: Host,
        config: BatchConfig,
        classes: ClassConfig,
        queue: OrderedDict[int, Entry[PayloadT]],
        running: dict[int, Batch[PayloadT]],
        pricing: Pricing[PayloadT],
    ) -> None:
        self._host = host
        self._config = config
        self.classes = classes
        self._queue = queue
        self._running = running
        self._pricing = pricing
        self._by_name: dict[str, ClassQueue] = {}
        self._order: list[ClassQueue] = []
        for rank, spec in enumerate(classes.classes):
            cap = classes.class_cap(spec, config.queue_size)
            wait = config.max_wait_s if spec.max_wait_s is None else spec.max_wait_s
            cq = ClassQueue(spec, rank, cap, classes.tenant_cap(cap), wait)
            self._by_name[spec.name] = cq
            self._order.append(cq)
        self._default = self._by_name[classes.default_class.name]
        classes.check_workers(config.workers)
        self._reserved = classes.reserved
        self._reserving = [cq for cq in self._order if cq.spec.reserve]
        # Round-robin quanta: weights scaled so the lightest tenant gets one item a turn.
        lightest = min([1.0, *(t.weight for t in classes.tenants)])
        self._quanta = {t.name: t.weight / lightest for t in classes.tenants}
        self._quantum = 1.0 / lightest
        for cq in self._order:
            cq.tally("")
            for t in classes.tenants:
                cq.tally(t.name)

    # -- queries ---------------------------------------------------------------------------

    def class_depths(self) -> dict[str, int]:
        """Live entries of each class waiting now, most urgent first."""
        return {cq.spec.name: len(cq.items) for cq in self._order}

    def class_statistics(self) -> dict[str, dict[str, Counters]]:
        """Outcome counters by class, then by tenant label (``""``: unnamed tenants)."""
        return {
            cq.spec.name: {label: t.snapshot() for label, t in cq.tallies.items()}
            for cq in self._order
        }

    def resolve(self, priority: str | int | None) -> WorkClass | None:
        """The class ``priority`` names: a class name, a level (1 = first), or the default.

        Raises:
            ConfigError: it names no class.
        """
        return self.classes.resolve(priority)

    def _queue_of(self, name: str | None) -> ClassQueue:
        if name is None:
            return self._default
        cq = self._by_name.get(name)
        if cq is None:
            raise ConfigError(f"class must be one of {', '.join(self._by_name)}, got {name!r}")
        return cq

    def _lane(self, cq: ClassQueue, tenant: str | None) -> Lane:
        lane = cq.lanes.get(tenant)
        if lane is not None:
            return lane
        quantum = self._quanta.get(tenant, self._quantum) if tenant is not None else self._quantum
        return cq.lane(tenant, quantum, self.classes.tenant_label(tenant))

    # -- admission -------------------------------------------------------------------------

    def refusal(
        self,
        now: float,
        deadline: float | None,
        work_class: str | None,
        tenant: str | None,
        offered: bool,
    ) -> Rejected | None:
        """Whether one more item of ``work_class`` for ``tenant`` would be refused now.

        A refusal is counted in its class and tenant label (see the module docstring).

        Raises:
            ConfigError: ``work_class`` names no class.
        """
        cq = self._queue_of(work_class)
        lane = self._lane(cq, tenant)
        tally = lane.tally
        if offered:
            tally.received += 1
        refusal = self._refusal_in(now, deadline, cq, lane)
        if refusal is not None:
            if offered:
                tally.rejected[refusal.reason] += 1
            else:
                tally.refuse(refusal.reason)
        if not lane.items and (refusal is not None or not offered):
            cq.lanes.pop(tenant, None)
        return refusal

    def _refusal_in(
        self, now: float, deadline: float | None, cq: ClassQueue, lane: Lane
    ) -> Rejected | None:
        # The admission rule; reads state, changes nothing.
        cfg = self._config
        host = self._host
        name = cq.spec.name
        if host.draining:
            return ShuttingDown(
                "the batcher is shutting down and admits no new work",
                retry_after_s=host.retry_after(now, "draining"),
            )
        depth = len(self._queue)
        if depth >= cfg.queue_size:
            return QueueFull(
                f"queue is full: {depth} items waiting, queue_size is {cfg.queue_size}",
                retry_after_s=self._lane_retry(cq, lane),
            )
        if len(cq.items) >= cq.cap:
            return QueueFull(
                f"class {name} is full: {len(cq.items)} items waiting, its queue_share "
                f"{cq.spec.queue_share:g} of queue_size {cfg.queue_size} is {cq.cap}",
                retry_after_s=self._lane_retry(cq, lane),
            )
        if lane.tenant is not None and len(lane.items) >= cq.tenant_cap:
            return QueueFull(
                f"tenant {lane.tenant} is at its share of class {name}: {len(lane.items)} "
                f"items waiting, tenant_share {self.classes.tenant_share:g} of {cq.cap} "
                f"is {cq.tenant_cap}",
                retry_after_s=self._lane_retry(cq, lane),
            )
        if deadline is None or not (cfg.admission or deadline <= now):
            return None
        finish = now
        if cfg.admission:
            passes_ahead = math.floor(len(lane.items) / self._lane_rate(cq, lane))
            finish = self._predict(now, passes_ahead, depth, cq)
            if passes_ahead == 0 and finish > deadline:
                # Its pass is cut short for its deadline if need be (see ``_fill``): it is
                # sure to hold the items of its own and more urgent classes, the rest may go.
                urgent = sum(len(c.items) for c in self._order if c.rank <= cq.rank)
                finish = self._predict(now, 0, urgent, cq)
            margin = DRIFT_MARGIN * (finish - now)
            spread = self._pricing.spread_s()
            if spread:
                margin += 2.0 * spread * math.sqrt(passes_ahead + 1 + len(self._running))
            finish += margin
        if deadline > now and (finish <= deadline or host.probe_ok(depth)):
            return None
        return DeadlineInfeasible(
            f"deadline cannot be met: an item of class {name} is predicted to finish in "
            f"{finish - now:.4f}s, its deadline is in {deadline - now:.4f}s",
            retry_after_s=max(MIN_RETRY_S, finish - deadline),
        )

    def _lane_rate(self, cq: ClassQueue, lane: Lane) -> float:
        # Items the lane is sure to get in each full pass while everyone else is queued too:
        # its class's weighted share (at least one item), split among the class's tenants.
        b = self._config.max_batch_size
        weights = cq.weight + sum(c.weight for c in self._order if c.items and c is not cq)
        per_class = max(1.0, b * cq.weight / weights)
        quanta = lane.quantum + sum(x.quantum for x in cq.ring if x is not lane)
        return per_class * lane.quantum / quanta

    def _predict(self, now: float, passes_ahead: int, depth: int, cq: ClassQueue) -> float:
        # When an item of class ``cq`` finishes, ``passes_ahead`` full passes after the next.
        cfg = self._config
        b = cfg.max_batch_size
        pricing = self._pricing
        fixed_s, per_item_s = pricing.costs(len(self._queue))
        passes_s = pricing.passes_s
        free = [now] * cfg.workers
        for i, batch in enumerate(self._running.values()):
            took = passes_s.get(batch.id) if passes_s is not None else None
            if took is None:
                took = fixed_s + len(batch.entries) * per_item_s
            expected = batch.start + took
            # A pass over its prediction is assumed to overrun as much again: a stuck model
            # still makes admission stricter as it goes on, but a pass a few milliseconds
            # late (a busy machine) does not refuse the queries behind it outright.
            free[i] = expected if expected >= now else now + (now - expected)
        position = passes_ahead * b if passes_ahead else min(depth, b - 1)
        # The pass it rides is dispatched when its oldest item of any class is due.
        due = now + (0.0 if self._host.draining else cq.max_wait_s)
        for c in self._order:
            if c.items:
                head = next(iter(c.items.values())).arrival + c.max_wait_s
                if head < due:
                    due = head
        return predict_finish_at(now, position, due, free, b, 0.0, fixed_s, per_item_s)

    def predict_finish(self, now: float) -> float:
        """When an item of the default class with no tenant admitted now would finish."""
        cq = self._default
        rate = self._lane_rate(cq, self._lane(cq, None))
        lane = cq.lanes.get(None)
        if lane is not None and not lane.items:
            cq.lanes.pop(None, None)
        waiting = len(lane.items) if lane is not None else 0
        return self._predict(now, math.floor(waiting / rate), len(self._queue), cq)

    def _lane_retry(self, cq: ClassQueue, lane: Lane) -> float:
        # The time for the lane to get one item into a pass: the passes it needs for one
        # item at its share, at the cost of passes as large as the queue supports.
        cfg = self._config
        depth = len(self._queue)
        fixed_s, per_item_s = self._pricing.costs(depth)
        n = max(1, min(cfg.max_batch_size, depth))
        passes = math.ceil(1.0 / min(1.0, self._lane_rate(cq, lane)))
        return max(MIN_RETRY_S, passes * (fixed_s + n * per_item_s) / cfg.workers)

    # -- the queues ------------------------------------------------------------------------

    def push(
        self,
        id: int,
        payload: PayloadT,
        now: float,
        deadline: float | None,
        size: int,
        work_class: str | None,
        tenant: str | None,
    ) -> Entry[PayloadT]:
        """A new entry at the back of its tenant's lane in its class's queue."""
        cq = self._queue_of(work_class)
        lane = self._lane(cq, tenant)
        entry = MixedEntry(id, payload, now, deadline, lane, size)
        cq.push(entry, lane)
        lane.tally.pending += 1
        return entry

    def removed(self, entry: Entry[PayloadT], cancelled: bool) -> None:
        """The entry leaves its lane, counted cancelled or expired there."""
        lane = _lane_of(entry)
        lane.owner.remove(entry, lane)
        tally = lane.tally
        if cancelled:
            tally.cancelled += 1
        else:
            tally.expired += 1
        tally.pending -= 1

    def expired_dispatched(self, entry: Entry[PayloadT]) -> None:
        """Counted expired in its lane, as in the policy."""
        tally = _lane_of(entry).tally
        tally.expired += 1
        tally.pending -= 1

    def due(self) -> float:
        """When the next pass must go: the first class whose oldest item's max wait is up."""
        return min(
            next(iter(cq.items.values())).arrival + cq.max_wait_s for cq in self._order if cq.items
        )

    def take(self, now: float, n: int, group: Group | None) -> list[Entry[PayloadT]]:
        """The next pass, filled by class shares (see the module docstring).

        With reserving classes: only their items while they have some queued; none (an
        empty pass: nothing may go now) when the other classes' passes would take a
        reserved worker.
        """
        active = [cq for cq in self._order if cq.items]
        if self._reserved:
            urgent = [cq for cq in self._reserving if cq.items]
            if urgent:
                active = urgent
            elif self._others_running() >= self._config.workers - self._reserved:
                return []
        entries = self._fill(now, n, group, active)
        queue = self._queue
        for e in entries:
            del queue[e.id]
        return entries

    def _others_running(self) -> int:
        # Running passes of non-reserving classes (a pass holds reserving classes' items
        # only, or none of them: its first item says which).
        return sum(
            1 for b in self._running.values() if not _lane_of(b.entries[0]).owner.spec.reserve
        )

    def _fill(
        self, now: float, n: int, group: Group | None, active: list[ClassQueue]
    ) -> list[Entry[PayloadT]]:
        # First round: each queued class of ``active`` its weighted share (and what it was
        # owed), at least one item; second round: what is left, to the classes in order of
        # urgency. The pass is cut short when a full one would finish after the tightest
        # deadline it holds.
        total = sum(cq.weight for cq in active)
        cfg = self._config
        window = cfg.length_window * cfg.max_batch_size
        out: list[Entry[PayloadT]] = []
        cap = n
        for cq in active:
            owed = n * cq.weight / total + cq.carry
            k = min(max(1, int(owed)), len(cq.items), cap - len(out))
            start = len(out)
            if k > 0:
                if group is None:
                    cq.take(k, out)
                else:
                    cq.take_joining(k, out, group, first=True, window=window)
                cap = self._cap(now, out, start, cap)
            # Credit below one item carries to the next pass; a class that emptied, or took
            # more than it was owed (its one-item floor), banks nothing and owes at most one;
            # one cut short by a deadline, or whose items did not join, is owed its share,
            # up to one pass.
            took = len(out) - start
            cq.carry = min(float(n), max(-1.0, owed - took)) if cq.items else 0.0
        for cq in active:
            left = cap - len(out)
            if left <= 0:
                break
            if cq.items:
                start = len(out)
                if group is None:
                    cq.take(min(left, len(cq.items)), out)
                else:
                    cq.take_joining(
                        min(left, len(cq.items)), out, group, first=False, window=window
                    )
                cap = self._cap(now, out, start, cap)
        return out

    def _cap(self, now: float, out: list[Entry[PayloadT]], start: int, cap: int) -> int:
        # The most items a pass may hold for the deadlines of ``out[start:]`` (with what it
        # holds already), by the pricing's costs less two standard errors; never fewer than
        # it holds: an item in it may miss its deadline, the others are not made to wait.
        deadlines = [e.deadline for e in out[start:] if e.deadline is not None]
        if not deadlines:
            return cap
        pricing = self._pricing
        fixed_s, per_item_s = pricing.costs(len(self._queue))
        if per_item_s <= 0:
            return cap
        room = min(deadlines) - now - fixed_s - 2.0 * pricing.spread_s()
        fits = math.floor(room / per_item_s) if room > 0 else 0
        return min(cap, max(len(out), fits))

    def count_pass(
        self,
        now: float,
        tally: Tally,
        entries: list[Entry[PayloadT]],
        failed: Collection[Entry[PayloadT]],
        skipped: Collection[Entry[PayloadT]],
    ) -> None:
        """Count each lane's entries by the policy's own rule (``tally_pass``).

        So the lanes add up to the policy's count: an entry already done is counted by
        neither again.
        """
        by_lane: dict[Lane, list[Entry[PayloadT]]] = {}
        for e in entries:
            by_lane.setdefault(_lane_of(e), []).append(e)
        for lane, group in by_lane.items():
            outcomes = tally_pass(now, group, failed, skipped)
            lane.tally.add_pass(*outcomes)
            tally.add_pass(*outcomes)


def _lane_of(entry: Entry[PayloadT]) -> Lane:
    assert isinstance(entry, MixedEntry)
    lane: Lane = entry.lane
    return lane
