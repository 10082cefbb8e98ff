"""One class's queue: a lane per tenant, served by deficit round robin, and its tallies.

Theory of operation
-------------------
A :class:`ClassQueue` holds the live queued entries of one class of work twice: all of them
in arrival order (``items``: its oldest is the head whose wait the max-wait rule bounds) and
each tenant's in a :class:`Lane` of its own, in arrival order. Lanes with items wait in a
ring. :meth:`ClassQueue.take` serves the ring by deficit round robin (Shreedhar and Varghese):
the lane at the front adds its ``quantum`` (its weight, scaled so the lightest tenant's is 1
item) to its deficit when it has less than one item of credit, gives as many items as its
whole credit allows, and goes to the back of the ring. A lane keeps the credit it had not
spent when a batch ended, so fairness holds across passes, not only within one. A lane that
empties leaves the ring with no credit (an idle tenant banks nothing) and is forgotten.

Every item is counted in the :class:`Tally` of its class and tenant label, so the outcome
identity holds per class and per configured tenant.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

from batchserve.policy.outcomes import Tally

if TYPE_CHECKING:
    from batchserve.policy.classes import WorkClass
    from batchserve.policy.entries import Entry
    from batchserve.policy.parts import Group

__all__ = ["ClassQueue", "Lane"]


class Lane:
    """One tenant's queued entries in one class, oldest first, and its round-robin credit."""

    __slots__ = ("deficit", "items", "owner", "quantum", "tally", "tenant")

    def __init__(self, owner: ClassQueue, tenant: str | None, quantum: float, tally: Tally) -> None:
        self.owner = owner
        self.tenant = tenant
        self.quantum = quantum
        self.tally = tally
        self.deficit = 0.0
        self.items: OrderedDict[int, Entry[Any]] = OrderedDict()


class ClassQueue:
    """The live queued entries of one class: in arrival order, and by tenant lane.

    Args:
        spec: the class.
        rank: its place in the configuration, 0 = most urgent.
        cap: items it may hold queued.
        tenant_cap: items one named tenant may hold queued in it.
        max_wait_s: how long its oldest item may wait for a batch to fill.
    """

    __slots__ = (
        "cap",
        "carry",
        "items",
        "lanes",
        "max_wait_s",
        "rank",
        "ring",
        "spec",
        "tallies",
        "tenant_cap",
        "weight",
    )

    def __init__(
        self, spec: WorkClass, rank: int, cap: int, tenant_cap: int, max_wait_s: float
    ) -> None:
        self.spec = spec
        self.rank = rank
        self.weight = spec.weight
        self.cap = cap
        self.tenant_cap = tenant_cap
        self.max_wait_s = max_wait_s
        self.items: OrderedDict[int, Entry[Any]] = OrderedDict()
        self.lanes: dict[str | None, Lane] = {}
        self.ring: deque[Lane] = deque()
        # Credit (in items) the class did not get in earlier passes, below one item.
        self.carry = 0.0
        self.tallies: dict[str, Tally] = {}

    def tally(self, label: str) -> Tally:
        """The counters of tenant label ``label`` in this class (made on first use)."""
        t = self.tallies.get(label)
        if t is None:
            t = self.tallies[label] = Tally()
        return t

    def lane(self, tenant: str | None, quantum: float, label: str) -> Lane:
        """The lane of ``tenant``, made (and put at the back of the ring) if it has none."""
        lane = self.lanes.get(tenant)
        if lane is None:
            lane = self.lanes[tenant] = Lane(self, tenant, quantum, self.tally(label))
        return lane

    def push(self, entry: Entry[Any], lane: Lane) -> None:
        """Queue ``entry`` at the back of its lane."""
        if not lane.items:
            self.ring.append(lane)
        lane.items[entry.id] = entry
        self.items[entry.id] = entry

    def remove(self, entry: Entry[Any], lane: Lane) -> None:
        """Take ``entry`` out of the queue (it left, or expired)."""
        del self.items[entry.id]
        del lane.items[entry.id]
        if not lane.items:
            self._forget(lane)

    def _forget(self, lane: Lane) -> None:
        self.ring.remove(lane)
        lane.deficit = 0.0
        del self.lanes[lane.tenant]

    def take(self, n: int, out: list[Entry[Any]]) -> None:
        """Move up to ``n`` entries into ``out``, tenants served by deficit round robin."""
        ring = self.ring
        items = self.items
        while n and ring:
            lane = ring[0]
            if lane.deficit < 1.0:
                lane.deficit += lane.quantum
            k = min(n, int(lane.deficit), len(lane.items))
            queue = lane.items
            for _ in range(k):
                entry = queue.popitem(last=False)[1]
                del items[entry.id]
                out.append(entry)
            lane.deficit -= k
            n -= k
            if not queue:
                ring.popleft()
                lane.deficit = 0.0
                del self.lanes[lane.tenant]
            elif lane.deficit < 1.0:
                ring.rotate(-1)

    def take_joining(
        self, n: int, out: list[Entry[Any]], group: Group, *, first: bool, window: int
    ) -> None:
        """As :meth:`take`, each item only if ``group`` takes it (a pass formed by tokens).

        ``first``: the first item joins whatever its tokens (its class's floor in a pass).
        Within a lane, the items that join are taken among its oldest ``window``, oldest
        first, as one FIFO queue forms a pass by tokens; a lane none of whose items join
        gives nothing more to this pass and keeps its credit for the next.
        """
        ring = self.ring
        items = self.items
        blocked: set[int] = set()
        while n and ring and len(blocked) < len(ring):
            lane = ring[0]
            if id(lane) in blocked:
                ring.rotate(-1)
                continue
            if lane.deficit < 1.0:
                lane.deficit += lane.quantum
            k = min(n, int(lane.deficit), len(lane.items))
            queue = lane.items
            chosen = []
            for entry in itertools.islice(queue.values(), window):
                if first:
                    group.force(entry.size)
                    first = False
                elif not group.joins(entry.size):
                    continue
                chosen.append(entry)
                if len(chosen) == k:
                    break
            for entry in chosen:
                del queue[entry.id]
                del items[entry.id]
                out.append(entry)
            got = len(chosen)
            lane.deficit -= got
            n -= got
            if not queue:
                ring.popleft()
                lane.deficit = 0.0
                del self.lanes[lane.tenant]
            elif got < k:
                blocked.add(id(lane))
                ring.rotate(-1)
            elif lane.deficit < 1.0:
                ring.rotate(-1)
