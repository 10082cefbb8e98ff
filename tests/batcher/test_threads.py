"""The Batcher with sync models in worker threads, on the real clock (fast models only)."""

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from batchserve.batcher import Batcher, BatchRecord
from batchserve.config import BatchConfig
from batchserve.errors import ModelError, OutputMismatch
from support import wait_for


class Poisoned:
    """Raises whenever its batch holds "bad"; records every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, xs: Sequence[str]) -> list[str]:
        self.calls.append(list(xs))
        if "bad" in xs:
            raise RuntimeError("cannot embed 'bad'")
        return [x.upper() for x in xs]


async def test_bisection_isolates_the_failing_input() -> None:
    model = Poisoned()
    records: list[BatchRecord] = []
    cfg = BatchConfig(max_batch_size=8, max_wait_s=0.05)
    async with Batcher(model, cfg, on_batch=records.append) as b:
        inputs = ["a", "b", "bad", "c", "d"]
        results = await asyncio.gather(*(b.submit(x) for x in inputs), return_exceptions=True)
    assert results[:2] == ["A", "B"]
    assert results[3:] == ["C", "D"]
    err = results[2]
    assert isinstance(err, ModelError)
    assert isinstance(err.__cause__, RuntimeError)
    assert model.calls[0] == inputs
    stats = b.statistics()
    assert stats.counters.failed == 1
    assert stats.counters.ok == 4
    assert stats.bisect_calls == records[0].bisect_calls > 0
    assert stats.bisect_calls <= 2 * len(inputs)


async def test_bisection_budget_bounds_extra_calls() -> None:
    model = Poisoned()
    cfg = BatchConfig(max_batch_size=8, max_wait_s=0.05, max_bisect_calls=0)
    async with Batcher(model, cfg) as b:
        results = await asyncio.gather(
            *(b.submit(x) for x in ["a", "bad", "c"]), return_exceptions=True
        )
    assert all(isinstance(r, ModelError) for r in results)
    assert len(model.calls) == 1


async def test_wrong_number_of_outputs_is_a_clear_error() -> None:
    async with Batcher(lambda xs: list(xs)[:-1], BatchConfig(max_wait_s=0.01)) as b:
        results = await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)
    assert all(isinstance(r, OutputMismatch) for r in results)
    assert "returned 1 outputs for 2 inputs" in str(results[0])


async def test_event_loop_keeps_forming_batches_during_a_pass() -> None:
    started = threading.Event()
    release = threading.Event()
    calls: list[list[int]] = []

    def model(xs: Sequence[int]) -> list[int]:
        calls.append(list(xs))
        if len(calls) == 1:
            started.set()
            release.wait(5)
        return list(xs)

    async def main() -> None:
        async with Batcher(model, BatchConfig(max_batch_size=4, max_wait_s=0.0)) as b:
            first = asyncio.ensure_future(b.submit(0))
            assert await asyncio.to_thread(started.wait, 10)
            # The first pass is blocked in its thread; the loop still admits and queues.
            later = [asyncio.ensure_future(b.submit(i)) for i in (1, 2, 3)]
            assert await wait_for(lambda: b.statistics().queue_depth == 3)
            release.set()
            assert await first == 0
            assert [await t for t in later] == [1, 2, 3]
        assert calls == [[0], [1, 2, 3]]

    await main()


async def test_two_workers_run_passes_concurrently() -> None:
    # Each pass waits for another to be running at the same time: with one worker the
    # barrier would break (BrokenBarrierError) instead of depending on sleeps overlapping.
    together = threading.Barrier(2, timeout=10)

    def model(xs: Sequence[Any]) -> list[Any]:
        together.wait()
        return list(xs)

    async def main() -> list[Any]:
        cfg = BatchConfig(max_batch_size=1, max_wait_s=0.0, workers=2)
        async with Batcher(model, cfg) as b:
            return await asyncio.gather(*(b.submit(i) for i in range(4)))

    assert await main() == [0, 1, 2, 3]


async def test_statistics_is_a_frozen_snapshot() -> None:
    async with Batcher(lambda xs: xs) as b:
        before = b.statistics()
        await b.submit(1)
        after = b.statistics()
    assert before.counters.ok == 0
    assert after.counters.ok == 1
    with pytest.raises(AttributeError):
        after.queue_depth = 3  # type: ignore[misc]


async def test_a_failing_listener_does_not_stall_the_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def listener(record: BatchRecord) -> None:
        raise RuntimeError("listener broke")

    async def main() -> list[int]:
        async with Batcher(lambda xs: list(xs), on_batch=listener) as b:
            return list(await asyncio.gather(b.submit(1), b.submit(2)))

    assert await main() == [1, 2]
    assert "on_batch listener raised" in caplog.text
