"""What the batcher hands back: each item's answer, each pass's record, and who waits.

:class:`Served` is one item's answer with how it was served; :class:`BatchRecord` is one
finished pass, for ``on_batch`` listeners (the server's metrics). A :class:`Waiter` is
answered once per item, on the batcher's loop, with no task, future or timer of its own;
:class:`Ticket` is the waiter of a Python caller (``submit``), holding an asyncio future.
:class:`Item` is the payload the policy carries for each entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, cast

from typing_extensions import TypeVar

from batchserve.policy import Entry

__all__ = ["BatchRecord", "Item", "Out", "Served", "Ticket", "Waiter", "settle_error"]

Out = TypeVar("Out", default=Any)


@dataclass(slots=True, kw_only=True)
class Served(Generic[Out]):
    """One item's answer with how it was served.

    Not frozen: one is made per item answered, and a frozen dataclass's ``__init__`` costs
    five times a plain one (a ``object.__setattr__`` call per field). Treat it as read-only.

    Attributes:
        output: what the model returned for the item.
        queue_wait_s: seconds from admission to the start of its forward pass.
        forward_s: seconds the forward pass took (bisection included).
        batch_size: items in the forward pass.
        batch_id: the forward pass's id, unique within the batcher.
    """

    output: Out
    queue_wait_s: float
    forward_s: float
    batch_size: int
    batch_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRecord:
    """What happened in one finished forward pass; handed to ``on_batch`` listeners.

    Attributes:
        batch_id: the pass's id.
        size: items that ran (skipped ones excluded).
        forward_s: seconds the pass took.
        queue_waits_s: each item's seconds from admission to the start of the pass.
        failed: items the model raised for.
        skipped: items dropped because their caller had left.
        bisect_calls: extra model calls spent isolating failures.
    """

    batch_id: int
    size: int
    forward_s: float
    queue_waits_s: tuple[float, ...]
    failed: int
    skipped: int
    bisect_calls: int


class Waiter(Protocol):
    """Who is answered when an item ends: called once per item, on the batcher's loop."""

    def settle(self, index: int, served: Served[Any] | None, error: BaseException | None) -> None:
        """Item ``index`` ended: ``served`` on success, else ``error`` (never both).

        It is not called for an item whose caller withdrew it. It must not raise.
        """


class Item:
    """The policy payload: the caller's input, its waiter and the item's index there."""

    __slots__ = ("index", "input", "waiter")

    def __init__(self, input: Any, waiter: Waiter, index: int) -> None:
        self.input = input
        self.waiter = waiter
        self.index = index


def settle_error(entry: Entry[Item], error: BaseException) -> None:
    """Answer ``entry``'s waiter with ``error``."""
    item = entry.payload
    item.waiter.settle(item.index, None, error)


class Ticket(Generic[Out]):
    """An admitted item. Await it for its :class:`Served`; cancel it to leave the queue."""

    __slots__ = ("_batcher", "_entry", "_future")

    def __init__(self, batcher: _Withdraws, future: asyncio.Future[Served[Out]]) -> None:
        self._batcher = batcher
        self._future = future
        self._entry: Entry[Item] | None = None

    def settle(self, index: int, served: Served[Any] | None, error: BaseException | None) -> None:
        """The :class:`Waiter` side: resolve the future (unless it was cancelled)."""
        fut = self._future
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(cast(Served[Out], served))

    def _on_done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() and self._entry is not None:
            self._batcher.withdraw(self._entry)

    @property
    def deadline(self) -> float | None:
        """The item's absolute deadline on the batcher's clock, or None."""
        assert self._entry is not None
        return self._entry.deadline

    def cancel(self) -> None:
        """Withdraw the item: it is removed from the queue, or skipped if not yet computed."""
        self._future.cancel()

    def done(self) -> bool:
        """Whether the item has its answer (or error) already."""
        return self._future.done()

    def __await__(self) -> Generator[Any, None, Served[Out]]:
        return self._future.__await__()


class _Withdraws(Protocol):
    """The batcher as a ticket sees it: it can withdraw the ticket's entry."""

    def withdraw(self, entry: Entry[Item]) -> None: ...
