"""The asyncio Batcher on a manual clock: exact virtual times, no real sleeps."""

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest

from batchserve.batcher import Batcher, Served
from batchserve.clock import ManualClock
from batchserve.config import BatchConfig
from batchserve.errors import DeadlineExceeded, ShuttingDown
from support import settle

T = TypeVar("T")


class Recorder:
    """An async model that takes `cost` virtual seconds and records what it saw, and when."""

    def __init__(self, clock: ManualClock, cost: float = 0.010) -> None:
        self.clock = clock
        self.cost = cost
        self.calls: list[tuple[float, list[Any]]] = []

    async def __call__(self, xs: Sequence[Any]) -> list[Any]:
        self.calls.append((self.clock.now(), list(xs)))
        await self.clock.sleep(self.cost)
        return [f"out({x})" for x in xs]


async def test_batch_closes_at_max_wait_with_exact_times() -> None:
    clock = ManualClock()
    model = Recorder(clock)
    b: Batcher[str] = Batcher(model, BatchConfig(max_batch_size=4, max_wait_s=0.002), clock=clock)
    t1 = asyncio.ensure_future(b.submit_nowait("a"))
    clock.advance(0.001)
    t2 = asyncio.ensure_future(b.submit_nowait("b"))
    await settle()
    clock.advance(0.0009)
    await settle()
    assert model.calls == []
    clock.advance(0.0001)
    await settle()
    assert [xs for _, xs in model.calls] == [["a", "b"]]
    assert model.calls[0][0] == pytest.approx(0.002)
    clock.advance(0.010)
    await settle()
    r1: Served[str] = await t1
    r2: Served[str] = await t2
    assert (r1.output, r2.output) == ("out(a)", "out(b)")
    assert r1.queue_wait_s == pytest.approx(0.002)
    assert r2.queue_wait_s == pytest.approx(0.001)
    assert r1.forward_s == pytest.approx(0.010)
    assert r1.batch_size == 2
    assert r1.batch_id == r2.batch_id == 0
    stats = b.statistics()
    assert stats.batch_sizes == {2: 1}
    assert stats.counters.ok == 2


async def test_full_batch_goes_at_once_and_next_forms_during_the_pass() -> None:
    clock = ManualClock()
    model = Recorder(clock)
    b: Batcher[str] = Batcher(model, BatchConfig(max_batch_size=2, max_wait_s=1.0), clock=clock)
    tickets = [b.submit_nowait(x) for x in "abc"]
    await settle()
    assert model.calls == [(0.0, ["a", "b"])]
    tickets.append(b.submit_nowait("d"))
    clock.advance(0.010)
    await settle()
    assert model.calls[1][1] == ["c", "d"]
    assert model.calls[1][0] == pytest.approx(0.010)
    clock.advance(0.010)
    await settle()
    assert [(await t).output for t in tickets] == ["out(a)", "out(b)", "out(c)", "out(d)"]


async def test_expiry_in_queue_is_answered_at_the_deadline() -> None:
    clock = ManualClock()
    model = Recorder(clock, cost=1.0)
    b: Batcher[str] = Batcher(
        model, BatchConfig(max_batch_size=1, max_wait_s=0.0, admission=False), clock=clock
    )
    first = b.submit_nowait("first")
    waiting = b.submit_nowait("waiting", timeout_s=0.25)
    await settle()
    clock.advance(0.2499)
    assert not waiting.done()
    clock.advance(0.0001)
    assert waiting.done(), "answered at its deadline, not when the running pass ends"
    with pytest.raises(DeadlineExceeded, match=r"after 0\.2500s in the queue"):
        await waiting
    clock.advance(1.0)
    await settle()
    assert (await first).output == "out(first)"
    assert [xs for _, xs in model.calls] == [["first"]], "expired item never computed"
    assert b.statistics().counters.expired == 1


async def test_deadline_while_running_answers_at_the_deadline_and_counts_late() -> None:
    clock = ManualClock()
    model = Recorder(clock, cost=1.0)
    b: Batcher[str] = Batcher(
        model, BatchConfig(max_batch_size=1, max_wait_s=0.0, admission=False), clock=clock
    )
    t = b.submit_nowait("slow", timeout_s=0.1)
    await settle()
    clock.advance(0.0999)
    assert not t.done()
    clock.advance(0.0001)
    assert t.done()
    with pytest.raises(DeadlineExceeded, match="forward pass was running"):
        await t
    clock.advance(1.0)
    await settle()
    c = b.statistics().counters
    assert (c.late, c.pending) == (1, 0)


async def test_cancelled_caller_is_never_computed() -> None:
    clock = ManualClock()
    model = Recorder(clock)
    b: Batcher[str] = Batcher(model, BatchConfig(max_batch_size=8, max_wait_s=0.005), clock=clock)
    keep = asyncio.ensure_future(b.submit("keep"))
    leave = asyncio.ensure_future(b.submit("leave"))
    await settle()
    leave.cancel()
    await settle()
    clock.advance(0.005)
    await settle()
    clock.advance(0.010)
    await settle()
    assert await keep == "out(keep)"
    assert [xs for _, xs in model.calls] == [["keep"]]
    c = b.statistics().counters
    assert (c.ok, c.cancelled) == (1, 1)


async def test_shutdown_drains_without_waiting_and_refuses_new() -> None:
    clock = ManualClock()
    model = Recorder(clock, cost=0.0)
    b: Batcher[str] = Batcher(model, BatchConfig(max_batch_size=8, max_wait_s=10.0), clock=clock)
    t = b.submit_nowait("queued")
    await settle()
    assert model.calls == []
    done = asyncio.ensure_future(b.shutdown())
    await settle()
    clock.advance(0.0)
    await settle()
    await done
    assert (await t).output == "out(queued)"
    with pytest.raises(ShuttingDown) as info:
        b.submit_nowait("late")
    assert info.value.reason == "draining"


async def test_shutdown_without_drain_answers_queued_items() -> None:
    clock = ManualClock()
    model = Recorder(clock, cost=0.0)
    b: Batcher[str] = Batcher(model, BatchConfig(max_batch_size=8, max_wait_s=10.0), clock=clock)
    t = b.submit_nowait("queued")
    await b.shutdown(drain=False)
    with pytest.raises(ShuttingDown):
        await t
    assert model.calls == []
    c = b.statistics().counters
    assert c.cancelled == 1
    assert c.received == c.resolved
