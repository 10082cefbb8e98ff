"""The Batcher with classes of work, on a manual clock: it drives the mixed policy."""

from collections.abc import Sequence
from typing import Any

import pytest

from batchserve.batcher import Batcher
from batchserve.clock import ManualClock
from batchserve.config import BatchConfig
from batchserve.errors import ConfigError, QueueFull
from batchserve.policy import ClassConfig, WorkClass
from support import settle

CLASSES = ClassConfig(
    classes=(
        WorkClass(name="interactive", queue_share=0.5, timeout_s=0.1),
        WorkClass(name="bulk", queue_share=0.5, timeout_s=30.0),
    ),
)


async def test_a_query_overtakes_the_bulk_queue_and_outcomes_are_counted_per_class() -> None:
    clock = ManualClock()
    calls: list[list[Any]] = []

    async def model(xs: Sequence[Any]) -> list[Any]:
        calls.append(list(xs))
        await clock.sleep(0.010)
        return list(xs)

    config = BatchConfig(max_batch_size=2, max_wait_s=0.001, queue_size=8)
    b: Batcher[str] = Batcher(model, config, clock=clock, classes=CLASSES)
    bulk = [b.submit_nowait(f"b{i}", priority="bulk", tenant="t") for i in range(6)]
    # b0 and b1 run at once; four wait, the bulk class's share of the queue.
    with pytest.raises(QueueFull, match="class bulk is full"):
        b.submit_nowait("b6", priority=2)
    await settle()
    q = b.submit_nowait("q", priority="interactive")
    assert q.deadline == pytest.approx(0.1)  # the class's default deadline
    assert bulk[0].deadline == pytest.approx(30.0)
    for _ in range(4):
        clock.advance(0.010)
        await settle()
    assert calls == [["b0", "b1"], ["q", "b2"], ["b3", "b4"], ["b5"]]
    assert (await q).output == "q"
    stats = b.class_statistics()
    assert stats["interactive"][""].ok == 1
    assert stats["bulk"][""].ok == 6
    assert stats["bulk"][""].rejected["queue_full"] == 1
    assert b.class_depths() == {"interactive": 0, "bulk": 0}
    with pytest.raises(ConfigError, match="must be one of interactive, bulk"):
        b.submit_nowait("x", priority="urgent")
    await b.shutdown()


async def test_a_priority_without_classes_is_an_error() -> None:
    b: Batcher[str] = Batcher(lambda xs: list(xs))
    with pytest.raises(ConfigError, match="the batcher has no classes"):
        b.submit_nowait("x", priority="bulk")
    assert b.class_statistics() == {}
    await b.shutdown()
