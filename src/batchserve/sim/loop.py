"""The simulator's one event loop: replicas of the policy on one virtual clock.

Theory of operation
-------------------
Every simulator drives :class:`~batchserve.policy.Policy` replicas the same way, and this is
that way, written once: :func:`simulate` (one replica, one request an item), the mix (one
replica, requests of several items of their class and tenant) and the fleet (N replicas
behind a router) differ only in what an arrival is and what an answer counts for, which
they give as a :class:`Driver`.

Events wait in a heap keyed ``(time, seq)``, ``seq`` growing with every push, so ties break
in the order events were scheduled: a finished pass, a replica's timer (one a replica,
re-armed when the policy's ``wake_at`` changes; a stale one is ignored) or, when asked for,
the release of an item at its deadline during its pass. The arrival schedule is known in
advance and is merged in from its sorted list, as if it had been pushed first: at equal
times an arrival comes before any other event. Arrivals at one instant arrive together: the
driver is handed all of them, then each replica it names is polled once.

After each event the replica concerned is polled and the answer carried out at once: the
driver sees the actions first (expired and late items, the batches), then each dispatched
batch begins on a free worker (its finish is pushed) or waits for one, and the timer is
re-armed. Nothing reads the wall clock: the same inputs give the same events, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from heapq import heappop, heappush
from typing import Generic, Protocol

from batchserve.policy import Actions, Batch, Entry, Policy
from batchserve.policy.entries import PayloadT
from batchserve.sim.workers import Workers

__all__ = ["Driver", "check_sorted", "run_events"]

_FINISH, _TIMER, _RELEASE = 0, 1, 2


class Driver(Protocol[PayloadT]):
    """What a simulation gives the event loop: its arrivals and what an answer counts for."""

    def arrive(self, now: float, first: int, last: int) -> Sequence[int]:
        """Arrivals ``first`` to ``last - 1`` of the schedule, all at ``now``: offer them.

        Returns:
            The replicas to poll now, in order (none: nothing changed).
        """
        ...

    def polled(self, replica: int, now: float, actions: Actions[PayloadT]) -> None:
        """A replica's poll answered ``actions`` (before its batches begin)."""
        ...

    def finished(
        self, replica: int, now: float, batch: Batch[PayloadT], skipped: list[Entry[PayloadT]]
    ) -> None:
        """A replica's pass ended (the policy has been told)."""
        ...

    def released(self, replica: int, now: float) -> None:
        """A late item's deadline passed during its pass (with ``release_late`` only)."""
        ...


class _Replica(Generic[PayloadT]):
    __slots__ = ("policy", "timer_at", "timer_seq", "workers")

    def __init__(self, policy: Policy[PayloadT], workers: Workers[PayloadT]) -> None:
        self.policy = policy
        self.workers = workers
        self.timer_seq = -1
        self.timer_at = math.inf


def run_events(
    times: Sequence[float],
    policies: Sequence[Policy[PayloadT]],
    workers: Sequence[Workers[PayloadT]],
    driver: Driver[PayloadT],
    *,
    release_late: bool = False,
) -> None:
    """Run the schedule ``times`` (sorted) against the replicas until nothing is left.

    Args:
        times: each arrival's time, sorted.
        policies: each replica's policy.
        workers: each replica's workers, in the same order.
        driver: the simulation's arrivals and answers.
        release_late: when a pass begins, push a release at the deadline of each of its
            items that it will end after (the driver's ``released``).
    """
    replicas = [_Replica(p, w) for p, w in zip(policies, workers, strict=True)]
    # (time, seq, kind, replica, batch): a finished batch, a timer (valid only while its
    # seq is the replica's timer_seq) or the release of a late item at its deadline.
    heap: list[tuple[float, int, int, int, Batch[PayloadT] | None]] = []
    seq = 0
    inf = math.inf
    n = len(times)

    def begin(r: int, done: float, b: Batch[PayloadT]) -> None:
        # A pass begins on replica ``r``'s worker, to end at ``done``.
        nonlocal seq
        seq += 1
        heappush(heap, (done, seq, _FINISH, r, b))
        if release_late:
            for e in b.entries:
                if e.deadline is not None and e.deadline < done:
                    seq += 1
                    heappush(heap, (e.deadline, seq, _RELEASE, r, None))

    def step(r: int, now: float) -> None:
        nonlocal seq
        rep = replicas[r]
        todo = rep.policy.poll(now)
        driver.polled(r, now, todo)
        for b in todo.dispatch:
            done = rep.workers.dispatch(now, b)
            if done is not None:
                begin(r, done, b)
        wake = todo.wake_at
        if wake is None:
            wake = inf
        if wake != rep.timer_at:
            rep.timer_at = wake
            if wake != inf:
                seq += 1
                rep.timer_seq = seq
                heappush(heap, (wake, seq, _TIMER, r, None))
            else:
                rep.timer_seq = -1

    i = 0
    while True:
        if i < n and (not heap or times[i] <= heap[0][0]):
            now = times[i]
            j = i + 1
            while j < n and times[j] == now:
                j += 1
            touched = driver.arrive(now, i, j)
            i = j
            for r in touched:
                step(r, now)
            continue
        if not heap:
            break
        now, s, kind, r, batch = heappop(heap)
        rep = replicas[r]
        if kind == _TIMER:
            if s != rep.timer_seq:
                continue
            rep.timer_at = inf
        elif kind == _RELEASE:
            driver.released(r, now)
            continue
        else:
            assert batch is not None
            skipped, nxt = rep.workers.end(now, batch)
            rep.policy.finish(now, batch, skipped=skipped)
            if nxt is not None:
                begin(r, *nxt)
            driver.finished(r, now, batch, skipped)
        step(r, now)


def check_sorted(arrivals: Sequence[float]) -> None:
    """Check an arrival schedule: sorted, and from 0.

    Raises:
        ValueError: an arrival is negative or before the one ahead of it (named).
    """
    prev = 0.0
    for i, t in enumerate(arrivals):
        if not t >= prev:
            rule = "must be >= 0" if i == 0 else "must be sorted"
            raise ValueError(f"arrivals {rule}: arrivals[{i}] is {t!r} after {prev!r}")
        prev = t
