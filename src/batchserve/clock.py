"""The clock: the only way the engine reads time or waits for it.

A :class:`Clock` tells the time (``now()``, float seconds, monotonic) and calls a function
back at an absolute time (``call_at``). The asyncio driver uses :class:`MonotonicClock`;
tests use :class:`ManualClock`, whose time moves only when the test calls ``advance`` and
which fires due callbacks in time order, so tests assert exact virtual times with no sleeps.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock", "TimerHandle"]


class TimerHandle(Protocol):
    """A scheduled callback that can be cancelled before it fires."""

    def cancel(self) -> None:
        """Stop the callback from firing; a no-op if it already fired."""


class Clock(Protocol):
    """Monotonic time in float seconds, and callbacks at absolute times on it."""

    def now(self) -> float:
        """The current time in seconds. Only differences are meaningful."""

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Call ``callback()`` on the event loop at time ``when`` (or soon after)."""


class MonotonicClock:
    """Real time: ``time.monotonic()``, callbacks through the running asyncio loop."""

    #: Seconds from ``time.monotonic()``: the function itself, so that a read costs what
    #: ``time.monotonic()`` costs (the server reads it a few times per request).
    now = staticmethod(time.monotonic)

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Schedule ``callback`` on the running loop ``when - now()`` seconds from now."""
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.monotonic()), callback)


class _ManualHandle:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock whose time moves only when told to; for tests and the simulator.

    Args:
        start: the initial time in seconds.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _ManualHandle]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        """The current virtual time."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Register ``callback`` to run when ``advance`` reaches ``when``."""
        handle = _ManualHandle(callback)
        heapq.heappush(self._timers, (when, next(self._seq), handle))
        return handle

    def next_timer(self) -> float | None:
        """The time of the earliest pending callback, or None."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def advance(self, dt: float) -> None:
        """Move time forward by ``dt`` seconds, firing due callbacks in time order.

        Each callback runs with ``now()`` equal to its own scheduled time, so a callback that
        schedules another one inside the window sees it fire too.
        """
        if dt < 0:
            raise ValueError(f"dt must be >= 0, got {dt!r}")
        target = self._now + dt
        while True:
            when = self.next_timer()
            if when is None or when > target:
                break
            _, _, handle = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            handle.callback()
        self._now = target

    async def sleep(self, dt: float) -> None:
        """Wait until ``advance`` has moved time ``dt`` seconds forward."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        self.call_at(self._now + dt, wake)
        await fut
