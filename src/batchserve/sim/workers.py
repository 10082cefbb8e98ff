"""The simulated model's workers: which dispatched passes run, and when each ends."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic

from batchserve.policy import Batch, Entry
from batchserve.policy.entries import PayloadT

__all__ = ["Workers"]


class Workers(Generic[PayloadT]):
    """``n`` workers on virtual time, as a simulator's finish events need them.

    A pass dispatched while a worker is free begins at once. One dispatched while every
    worker is busy (prefetched: :attr:`~batchserve.config.BatchConfig.prefetch`) waits and
    begins when a pass ends, as the policy's ``finish`` begins it. A pass runs the items
    still live when it begins, as the Batcher's worker does (an item whose caller left, or
    whose deadline passed while it waited, costs no model time): it takes ``took(live)``, or
    no time at all when none is left.

    Args:
        n: the workers.
        took: seconds a pass of these items takes.

    Attributes:
        passes: passes begun that ran at least one item (one left with none is no pass, as
            the policy counts it).
        items: items those passes ran.
    """

    def __init__(self, n: int, took: Callable[[list[Entry[PayloadT]]], float]) -> None:
        self.passes = 0
        self.items = 0
        self._n = n
        self._free = n
        self._took = took
        self._waiting: deque[Batch[PayloadT]] = deque()
        self._skipped: dict[int, list[Entry[PayloadT]]] = {}

    @property
    def busy(self) -> int:
        """Workers running a pass (while ``took`` prices one, that one included)."""
        return self._n - self._free

    def dispatch(self, now: float, batch: Batch[PayloadT]) -> float | None:
        """A batch the policy dispatched: its end if it begins now, None if it waits."""
        if not self._free:
            self._waiting.append(batch)
            return None
        self._free -= 1
        return self._begin(now, batch)

    def end(
        self, now: float, batch: Batch[PayloadT]
    ) -> tuple[list[Entry[PayloadT]], tuple[float, Batch[PayloadT]] | None]:
        """``batch``'s pass has ended: what it skipped, and what begins on its worker.

        Returns the entries the pass did not run, and the pass that begins now with its end
        (None: the worker is free).
        """
        skipped = self._skipped.pop(batch.id, [])
        if not self._waiting:
            self._free += 1
            return skipped, None
        nxt = self._waiting.popleft()
        return skipped, (self._begin(now, nxt), nxt)

    def _begin(self, now: float, batch: Batch[PayloadT]) -> float:
        live = [e for e in batch.entries if not e.withdrawn]
        if len(live) < len(batch.entries):
            self._skipped[batch.id] = [e for e in batch.entries if e.withdrawn]
        if not live:
            return now
        self.passes += 1
        self.items += len(live)
        return now + self._took(live)
