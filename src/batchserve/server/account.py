"""The live account of a model's passes: what ``/status`` and Triton's statistics read.

:class:`~batchserve.server.ops.metrics.Metrics` keeps one :class:`Passes` per model, fed after
every forward pass: passes and forward time by batch size, and the latest pass times and
queue waits in fixed rings (:class:`Window`: adding a value is a store and an add, so the
request path pays nothing for the live quantiles). :class:`Account` is its frozen snapshot, taken on
demand; :func:`quantile` reads a window.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FORWARD_WINDOW", "QUEUE_WAIT_WINDOW", "Account", "Passes", "Window", "quantile"]

#: The latest this many forward passes, and this many items' queue waits, make the window
#: the live quantiles are taken over.
FORWARD_WINDOW = 512
QUEUE_WAIT_WINDOW = 2048


class Window:
    """The latest ``size`` values, overwritten in a ring: adding one is a store and an add."""

    __slots__ = ("count", "values")

    def __init__(self, size: int) -> None:
        self.values = [0.0] * size
        self.count = 0

    def add(self, value: float) -> None:
        """Keep ``value``, overwriting the oldest once the ring is full."""
        values = self.values
        values[self.count % len(values)] = value
        self.count += 1

    def extend(self, new: tuple[float, ...]) -> None:
        """Keep every value of ``new``, in order."""
        # In slices, not one call per value: a pass's items are added at once.
        values, n = self.values, len(new)
        size = len(values)
        if n >= size:
            start = (self.count + n - size) % size
            values[start:] = new[n - size : n - start]
            values[:start] = new[n - start :]
        else:
            start = self.count % size
            first = min(n, size - start)
            values[start : start + first] = new[:first]
            values[: n - first] = new[first:]
        self.count += n

    def latest(self) -> tuple[float, ...]:
        """The values kept, at most ``size`` (in ring order, not time order)."""
        return tuple(self.values[: min(self.count, len(self.values))])


class Passes:
    """One model's forward passes: by batch size, the latest ones, the last one's time."""

    __slots__ = ("by_size", "forward", "item_forward_s", "last_unix", "queue_wait")

    def __init__(self) -> None:
        #: batch size -> [passes, seconds of forward time].
        self.by_size: dict[int, list[float]] = {}
        #: sum over passes of forward time x items: each item's pass time, added up.
        self.item_forward_s = 0.0
        self.last_unix: float | None = None
        self.forward = Window(FORWARD_WINDOW)
        self.queue_wait = Window(QUEUE_WAIT_WINDOW)


@dataclass(frozen=True, slots=True, kw_only=True)
class Account:
    """A frozen snapshot of one model's accounting, for the views built on the metrics.

    Attributes:
        requests: (outcome, reason) -> requests that ended so.
        success_s: seconds of the successful requests, arrival to answer, added up.
        other_s: outcome -> seconds of the requests that ended so (every outcome but ``ok``).
        items: items that ran in a forward pass.
        passes: forward passes.
        queue_wait_s: the items' seconds from admission to their pass, added up.
        forward_s: the passes' seconds, added up.
        item_forward_s: each item's pass time, added up (forward time x items per pass).
        by_size: batch size -> (passes, seconds of forward time).
        last_pass_unix: when the last pass ended (Unix seconds), None before the first.
        recent_forward_s: the latest passes' forward times (at most FORWARD_WINDOW).
        recent_queue_wait_s: the latest items' queue waits (at most QUEUE_WAIT_WINDOW).
    """

    requests: dict[tuple[str, str], int]
    success_s: float
    other_s: dict[str, float]
    items: int
    passes: int
    queue_wait_s: float
    forward_s: float
    item_forward_s: float
    by_size: dict[int, tuple[int, float]]
    last_pass_unix: float | None
    recent_forward_s: tuple[float, ...]
    recent_queue_wait_s: tuple[float, ...]

    def count(self, outcome: str) -> int:
        """Requests that ended in ``outcome``, whatever the reason."""
        return sum(n for (o, _), n in self.requests.items() if o == outcome)


def quantile(values: tuple[float, ...] | list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by the nearest rank; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))
    return ordered[rank]
