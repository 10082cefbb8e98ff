"""A pass that ends after an item's deadline answers it late (504), even if no timer ran.

The deadline guard is a timer; on a loop too busy to run it before the pass's completion
callback, the completion used to hand the caller a success after its deadline (while the
policy counted it ``late``). No real time here: a clock whose timers never fire stands in
for the busy loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from batchserve.batcher import Batcher
from batchserve.clock import ManualClock
from batchserve.config import BatchConfig
from batchserve.errors import DeadlineExceeded

pytestmark = pytest.mark.reliability


class _Never:
    def cancel(self) -> None:
        pass


class StuckTimerClock:
    """A clock set by hand whose callbacks never fire (a loop too busy to run them)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def call_at(self, when: float, callback: Callable[[], None]) -> _Never:
        return _Never()


async def test_a_pass_that_ends_after_the_deadline_is_late_not_ok() -> None:
    clock = StuckTimerClock()

    async def model(xs: Sequence[str]) -> list[str]:
        clock.t = 2.0  # the pass ends after the first item's deadline
        return list(xs)

    b: Batcher[str] = Batcher(model, BatchConfig(max_wait_s=0.0), clock=clock)
    late = b.submit_nowait("late", deadline=1.0)
    fine = b.submit_nowait("fine", deadline=3.0)
    with pytest.raises(DeadlineExceeded, match="forward pass") as info:
        await late
    assert info.value.during_pass
    assert (await fine).output == "fine"
    c = b.statistics().counters
    assert (c.ok, c.late) == (1, 1)


async def test_deadline_exceeded_says_where_the_deadline_passed() -> None:
    clock = ManualClock()

    async def model(xs: Sequence[str]) -> list[str]:
        await clock.sleep(1.0)
        return list(xs)

    cfg = BatchConfig(max_batch_size=1, max_wait_s=0.0, admission=False)
    b: Batcher[str] = Batcher(model, cfg, clock=clock)
    running = b.submit_nowait("running", deadline=0.5)
    queued = b.submit_nowait("queued", deadline=0.2)
    for _ in range(5):
        await asyncio.sleep(0)
    clock.advance(0.6)
    with pytest.raises(DeadlineExceeded) as in_queue:
        await queued
    with pytest.raises(DeadlineExceeded) as in_pass:
        await running
    assert not in_queue.value.during_pass
    assert in_pass.value.during_pass
    clock.advance(1.0)
    for _ in range(5):
        await asyncio.sleep(0)
    c = b.statistics().counters
    assert (c.expired, c.late) == (1, 1)
