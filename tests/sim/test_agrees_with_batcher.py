"""The simulator and the asyncio Batcher are two drivers of one policy: with a model whose
passes take exactly the simulated cost (on a manual clock, so the Batcher has no overhead),
they must give every request the same outcome at the same time."""

import asyncio
import math
from collections.abc import Sequence

import pytest

from batchserve.batcher import Batcher, Ticket
from batchserve.clock import ManualClock
from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import DeadlineExceeded, Rejected
from batchserve.sim import simulate
from batchserve.workload.arrivals import arrival_times
from support import settle

COST = CostEstimate(fixed_s=0.008, per_item_s=0.00025)
Outcome = tuple[str, float]


def advance_exactly(clock: ManualClock, when: float) -> None:
    # now + (when - now) can round below `when`; step up until the sum lands on it.
    dt = when - clock.now()
    while clock.now() + dt < when:
        dt = math.nextafter(dt, math.inf)
    clock.advance(dt)


async def run_batcher(
    config: BatchConfig, arrivals: list[float], timeout_s: float
) -> list[Outcome]:
    clock = ManualClock()

    async def model(xs: Sequence[object]) -> list[object]:
        await clock.sleep(COST.fixed_s + len(xs) * COST.per_item_s)
        return list(xs)

    outcomes: list[Outcome] = [("", 0.0)] * len(arrivals)

    async def wait(i: int, ticket: Ticket[object], at: float) -> None:
        try:
            await ticket
        except DeadlineExceeded:
            outcomes[i] = ("timed_out", 0.0)
        else:
            outcomes[i] = ("ok", clock.now() - at)

    async def step_to(when: float) -> None:
        while (t := clock.next_timer()) is not None and t < when:
            advance_exactly(clock, t)
            await settle(10)
        advance_exactly(clock, when)
        await settle(10)

    batcher: Batcher[object] = Batcher(model, config, clock=clock)
    tasks = []
    for i, at in enumerate(arrivals):
        await step_to(at)
        try:
            ticket = batcher.submit_nowait(i, deadline=at + timeout_s)
        except Rejected as exc:
            outcomes[i] = ("rejected:" + exc.reason, 0.0)
            continue
        tasks.append(asyncio.ensure_future(wait(i, ticket, at)))
        await settle(10)
    # Until every caller has its answer and every pass (even a late one) has ended.
    while not all(t.done() for t in tasks) or batcher.statistics().running_batches:
        t = clock.next_timer()
        assert t is not None
        await step_to(t)
    await batcher.shutdown()
    return outcomes


def sim_outcomes(config: BatchConfig, arrivals: list[float], timeout_s: float) -> list[Outcome]:
    r = simulate(config=config, cost=COST, arrivals=arrivals, timeout_s=timeout_s, trace=True)
    out: list[Outcome] = [("", 0.0)] * len(arrivals)
    for ev in r.trace:
        if ev.kind == "reject":
            out[ev.ids[0]] = ("rejected:" + ev.detail, 0.0)
        elif ev.kind == "expire":
            out[ev.ids[0]] = ("timed_out", 0.0)
        elif ev.kind == "finish":
            for i in ev.ids:
                late = ev.time > arrivals[i] + timeout_s
                out[i] = ("timed_out", 0.0) if late else ("ok", ev.time - arrivals[i])
    return out


@pytest.mark.parametrize("admission", [True, False])
@pytest.mark.parametrize(("max_batch_size", "max_wait_s"), [(1, 0.0), (8, 0.002), (32, 0.02)])
async def test_every_request_gets_the_same_outcome_at_the_same_time(
    admission: bool, max_batch_size: int, max_wait_s: float
) -> None:
    # An overload (900/s) for the small batches, so refusals and expiries happen too.
    arrivals = arrival_times(rate=900, duration_s=0.25, arrivals="poisson", seed=3)
    config = BatchConfig(
        max_batch_size=max_batch_size, max_wait_s=max_wait_s, queue_size=16, admission=admission
    )
    got = await run_batcher(config, arrivals, 0.04)
    want = sim_outcomes(config, arrivals, 0.04)
    assert [k for k, _ in got] == [k for k, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=1e-9)
    kinds = {k for k, _ in want}
    assert "ok" in kinds
    if max_batch_size == 1:
        assert len(kinds) > 1  # the overload shows: not everything was served
