"""A sync model's prefetched pass begins in its worker thread, without the event loop."""

import asyncio
import threading
from collections.abc import Sequence

import pytest

from batchserve.batcher import Batcher
from batchserve.config import BatchConfig
from batchserve.errors import ShuttingDown


class FirstPassBlocks:
    """A model whose first pass blocks until ``release`` is set; it records every pass."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.first_began = threading.Event()
        self.later_began = threading.Event()
        self.calls: list[list[str]] = []

    def __call__(self, xs: Sequence[str]) -> list[str]:
        self.calls.append(list(xs))
        if len(self.calls) == 1:
            self.first_began.set()
            self.release.wait(10)
        else:
            self.later_began.set()
        return [x.upper() for x in xs]


@pytest.mark.parametrize("prefetch", [True, False])
async def test_the_next_full_batch_begins_while_the_event_loop_is_held(prefetch: bool) -> None:
    model = FirstPassBlocks()
    b: Batcher[str] = Batcher(
        model, BatchConfig(max_batch_size=2, max_wait_s=1.0, prefetch=prefetch)
    )
    first = [b.submit_nowait(x) for x in "ab"]
    assert model.first_began.wait(5)  # the first pass is under way, blocked in the model
    second = [b.submit_nowait(x) for x in "cd"]  # a full batch while the worker is busy
    assert b.statistics().running_batches == (2 if prefetch else 1)
    model.release.set()
    # The loop is held here (a blocking wait, no await): only the worker thread can begin
    # the second pass, and it can only if the batch was handed over before the first ended.
    began = model.later_began.wait(5.0 if prefetch else 0.5)
    assert began is prefetch
    assert [(await t).output for t in first + second] == ["A", "B", "C", "D"]
    assert model.calls == [["a", "b"], ["c", "d"]]
    await b.shutdown()


async def test_a_shutdown_without_drain_drops_prefetched_batches_as_queued_ones() -> None:
    model = FirstPassBlocks()
    b: Batcher[str] = Batcher(model, BatchConfig(max_batch_size=2, max_wait_s=1.0))
    first = [b.submit_nowait(x) for x in "ab"]
    assert model.first_began.wait(5)
    prefetched = [b.submit_nowait(x) for x in "cd"]  # dispatched behind the running pass
    queued = b.submit_nowait("e")
    assert b.statistics().running_batches == 2
    stopping = asyncio.ensure_future(b.shutdown(drain=False))
    for ticket in [*prefetched, queued]:
        with pytest.raises(ShuttingDown):
            await ticket
    model.release.set()
    await stopping
    assert [(await t).output for t in first] == ["A", "B"]
    assert model.calls == [["a", "b"]]  # the prefetched pass began with nothing left to run
    counters = b.statistics().counters
    assert (counters.ok, counters.cancelled) == (2, 3)
