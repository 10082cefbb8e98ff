"""What the policy tracks and hands to its driver: entries, batches, actions.

An :class:`Entry` is one admitted item (its state goes queued -> running -> done, or
queued -> prefetched -> running -> done when its batch waits behind a running pass), a
:class:`Batch` one dispatched forward pass, and :class:`Actions` what one ``poll`` asks the
driver to do. Plain slotted classes: one entry is made per item on the hot path.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["DONE", "PREFETCHED", "QUEUED", "RUNNING", "Actions", "Batch", "Entry", "PayloadT"]

PayloadT = TypeVar("PayloadT")

QUEUED, RUNNING, DONE, PREFETCHED = 0, 1, 2, 3


class Entry(Generic[PayloadT]):
    """One admitted item, as the policy tracks it.

    Attributes:
        id: unique, increasing with admission order.
        payload: the driver's own data (the input, a future...); the policy never reads it.
        arrival: admission time.
        deadline: absolute time by which it must finish, or None.
        state: 0 queued, 1 running, 2 done, 3 prefetched (dispatched, its pass not begun).
        withdrawn: no caller waits for its result any more (it left, or was answered at its
            deadline during the pass); a running entry withdrawn is skipped before the pass.
        size: its tokens, for a policy that forms batches by tokens (1 otherwise).
    """

    __slots__ = ("arrival", "deadline", "id", "payload", "size", "state", "withdrawn")

    def __init__(
        self,
        id: int,
        payload: PayloadT,
        arrival: float,
        deadline: float | None,
        size: int = 1,
    ) -> None:
        self.id = id
        self.payload = payload
        self.arrival = arrival
        self.deadline = deadline
        self.size = size
        self.state = QUEUED
        self.withdrawn = False

    def __repr__(self) -> str:
        return f"Entry(id={self.id}, arrival={self.arrival}, deadline={self.deadline})"


class Batch(Generic[PayloadT]):
    """A dispatched forward pass.

    Attributes:
        id: unique, increasing with dispatch order.
        entries: the items, in queue order.
        start: when the pass began: its dispatch, or for a prefetched batch the end of the
            pass it waited behind (set by ``Policy.finish``).
    """

    __slots__ = ("entries", "id", "start")

    def __init__(self, id: int, entries: list[Entry[PayloadT]], start: float) -> None:
        self.id = id
        self.entries = entries
        self.start = start

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"Batch(id={self.id}, start={self.start}, ids={[e.id for e in self.entries]})"


class Actions(Generic[PayloadT]):
    """What ``poll`` asks the driver to do now.

    Attributes:
        expired: entries whose deadline passed while queued (or prefetched, their pass not
            begun); answer them "deadline exceeded".
        dispatch: batches to run, in order: each on a free worker, or (prefetched) queued
            behind the running passes to begin when one ends.
        wake_at: call ``poll`` again at this time unless another event comes first (None: no
            timer needed).
        late: running entries whose deadline passed during their pass (now withdrawn);
            answer them "deadline exceeded" now, not when the pass ends.
    """

    __slots__ = ("dispatch", "expired", "late", "wake_at")

    def __init__(
        self,
        expired: list[Entry[PayloadT]],
        dispatch: list[Batch[PayloadT]],
        wake_at: float | None,
        late: list[Entry[PayloadT]] | None = None,
    ) -> None:
        self.expired = expired
        self.dispatch = dispatch
        self.wake_at = wake_at
        self.late = late if late is not None else []
