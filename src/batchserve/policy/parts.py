"""The two parameters a policy is composed of: its queue's discipline and its passes' cost.

Theory of operation
-------------------
:class:`~batchserve.policy.core.Policy` is one state machine (admission, expiry, dispatch,
running deadlines, outcomes) composed of two parts, each chosen when it is built:

* a **discipline** (:class:`Discipline`): how the queued items wait and which go next.
  :class:`~batchserve.policy.fifo.Fifo` is one queue, oldest first;
  :class:`~batchserve.policy.mixed.Classes` is a queue per class of work and a lane per
  tenant, served by shares. It owns admission's rule (where a new item would wait, and so
  when it would finish), when a pass is due, which items a pass takes, and the tallies of
  its classes and tenants.
* a **pricing** (:class:`Pricing`): what a pass costs and how that cost is learned.
  :class:`ByCount` prices a pass by its items with the policy's cost model
  (``fixed_s + n * per_item_s``); :class:`~batchserve.policy.tokens.ByTokens` by its
  tokens, as length-sorted sub-passes. It tells a discipline whether an item may join a
  pass being formed (a :class:`Group`: None when every item joins), whether the queue is
  full by its own measure, and the figures admission predicts with.

Either discipline works with either pricing: classes of work with passes formed by tokens
is the discipline of classes taking its items through the token pricing's group.

The parts read the policy they serve through :class:`Host` (the policy itself), and share
its containers (the queue of every live queued entry, the running batches), which only the
policy and its discipline write.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from batchserve.costmodel import CostModel
from batchserve.errors import Rejected
from batchserve.policy.classes import WorkClass
from batchserve.policy.entries import Batch, Entry, PayloadT
from batchserve.policy.outcomes import Counters, Tally, TokenStats

__all__ = ["ByCount", "Discipline", "Group", "Host", "Pricing"]


class Host(Protocol):
    """What a discipline reads of the policy it serves."""

    @property
    def draining(self) -> bool:
        """Whether the policy is closed."""
        ...

    def predict_finish(self, now: float) -> float:
        """When an item of the default class admitted now would finish."""
        ...

    def retry_after(self, now: float, reason: str) -> float:
        """Seconds after which a refused item could be admitted."""
        ...

    def probe_ok(self, depth: int) -> bool:
        """Whether an item predicted late is admitted all the same, as a probe."""
        ...


class Group(Protocol):
    """A pass being formed, as its pricing sees it: which further items may join it."""

    def force(self, size: int) -> None:
        """An item of ``size`` tokens joins whatever it costs (the pass's first)."""
        ...

    def joins(self, size: int) -> bool:
        """Whether an item of ``size`` tokens may join; if so, it has joined."""
        ...


class Pricing(Protocol[PayloadT]):
    """What a pass costs: the policy's second parameter (see the module docstring).

    Attributes:
        settled_depth: queued items from which no later arrival can change the next pass
            (it may then be prefetched).
        passes_s: each dispatched pass's predicted seconds, by batch id, when the pricing
            predicts a pass from its items; None: from the cost model by count.
        fills: whether the queue can hold a full pass by the pricing's own measure (then
            ``full`` is asked at every poll).
    """

    settled_depth: int
    passes_s: dict[int, float] | None
    fills: bool

    def admit(self, size: int) -> int:
        """An item of ``size`` joins the queue: the size its entry keeps."""
        ...

    def left(self, entry: Entry[PayloadT]) -> None:
        """A queued entry left the queue without running (cancelled, expired)."""
        ...

    def full(self) -> bool:
        """Whether the queue holds a full pass by the pricing's own measure (tokens)."""
        ...

    def group(self) -> Group | None:
        """A pass about to be formed; None: every item joins (passes by count)."""
        ...

    def taken(self, entries: list[Entry[PayloadT]]) -> None:
        """The entries of a pass left the queue."""
        ...

    def dispatched(self, batch: Batch[PayloadT]) -> None:
        """A batch was dispatched."""
        ...

    def finished(
        self,
        now: float,
        batch: Batch[PayloadT],
        failed: Collection[Entry[PayloadT]],
        skipped: Collection[Entry[PayloadT]],
    ) -> None:
        """A pass ended (after the policy's cost model has learned it)."""
        ...

    def costs(self, depth: int) -> tuple[float, float]:
        """``(fixed_s, per_item_s)`` of a pass of the ``depth`` queued items, for admission."""
        ...

    def spread_s(self) -> float:
        """The error of one pass's prediction, for admission's margin."""
        ...

    def tokens(self) -> TokenStats | None:
        """The tokens' figures for the statistics (None: passes by count)."""
        ...


class Discipline(Protocol[PayloadT]):
    """How queued items wait and which go next: the policy's first parameter.

    Attributes:
        name: ``fifo`` or ``classes``.
        prefetches: whether a settled batch may be prefetched while every worker is busy.
        caches_screens: whether a passed ``screen`` may stand for the offer that follows.
    """

    name: str
    prefetches: bool
    caches_screens: bool

    def resolve(self, priority: str | int | None) -> WorkClass | None:
        """The class an item's ``priority`` names; None with one queue.

        Raises:
            ConfigError: ``priority`` names no class (with one queue: any priority).
        """
        ...

    def refusal(
        self,
        now: float,
        deadline: float | None,
        work_class: str | None,
        tenant: str | None,
        offered: bool,
    ) -> Rejected | None:
        """Whether one more item would be refused now.

        It reads the policy and changes nothing but the counts of its class and tenant
        (``offered``: it is an offer, not a screen).

        Raises:
            ConfigError: ``work_class`` names no class.
        """
        ...

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
        """A new entry for an admitted item, queued in the discipline's own order."""
        ...

    def removed(self, entry: Entry[PayloadT], cancelled: bool) -> None:
        """A queued entry left the queue: cancelled, or (``cancelled`` False) expired."""
        ...

    def expired_dispatched(self, entry: Entry[PayloadT]) -> None:
        """A prefetched entry expired before its pass began."""
        ...

    def due(self) -> float:
        """When the next pass must go though not full (the queue is not empty)."""
        ...

    def take(self, now: float, n: int, group: Group | None) -> list[Entry[PayloadT]]:
        """At most ``n`` entries of the next pass, taken off the queues.

        At least one, unless no pass may go now (workers kept for a class that has nothing
        queued: :mod:`batchserve.policy.mixed`). The policy deletes them from its queue of
        every live entry.
        """
        ...

    def predict_finish(self, now: float) -> float:
        """When an item of the default class admitted now would finish."""
        ...

    def count_pass(
        self,
        now: float,
        tally: Tally,
        entries: list[Entry[PayloadT]],
        failed: Collection[Entry[PayloadT]],
        skipped: Collection[Entry[PayloadT]],
    ) -> None:
        """Count the outcomes of a pass's entries in ``tally`` (and the discipline's own)."""
        ...

    def class_statistics(self) -> dict[str, dict[str, Counters]]:
        """Outcome counters by class, then tenant label (empty with one queue)."""
        ...

    def class_depths(self) -> dict[str, int]:
        """Live entries of each class waiting now (empty with one queue)."""
        ...


class ByCount:
    """The pricing of passes by count: the policy's cost model, ``fixed_s + n * per_item_s``.

    Args:
        cost_model: the policy's cost model (the policy teaches it every pass).
        max_batch_size: a full pass (from that many queued items the next pass is settled).
    """

    __slots__ = ("_cost_model", "fills", "passes_s", "settled_depth")

    def __init__(self, cost_model: CostModel, max_batch_size: int) -> None:
        self._cost_model = cost_model
        self.settled_depth = max_batch_size
        self.passes_s: dict[int, float] | None = None
        self.fills = False

    def admit(self, size: int) -> int:
        """The size as given (not read)."""
        return size

    def left(self, entry: Entry[PayloadT]) -> None:
        """Nothing to give back."""

    def full(self) -> bool:
        """Never: a pass by count is full by its items alone."""
        return False

    def group(self) -> Group | None:
        """None: every item joins."""
        return None

    def taken(self, entries: list[Entry[PayloadT]]) -> None:
        """Nothing to note."""

    def dispatched(self, batch: Batch[PayloadT]) -> None:
        """Nothing to note."""

    def finished(
        self,
        now: float,
        batch: Batch[PayloadT],
        failed: Collection[Entry[PayloadT]],
        skipped: Collection[Entry[PayloadT]],
    ) -> None:
        """Nothing more to learn than the policy's cost model has."""

    def costs(self, depth: int) -> tuple[float, float]:
        """The cost model's estimate."""
        est = self._cost_model.estimate
        return est.fixed_s, est.per_item_s

    def spread_s(self) -> float:
        """The cost model's own prediction error."""
        return self._cost_model.spread_s

    def tokens(self) -> TokenStats | None:
        """None: no tokens are counted."""
        return None
