"""The simulator's mixed-traffic driver and the asyncio Batcher drive one policy with classes: on a
manual clock (no overhead), with passes that take exactly the simulated cost, every class
and tenant gets the same outcomes with the same latencies."""

import asyncio
from collections.abc import Sequence

import pytest
from test_agrees_with_batcher import advance_exactly

from batchserve.batcher import Batcher, Ticket
from batchserve.clock import ManualClock
from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import DeadlineExceeded, Rejected
from batchserve.policy import ClassConfig, WorkClass
from batchserve.sim.mix import Stream, simulate_mix
from batchserve.workload.arrivals import arrival_times
from batchserve.workload.summary import percentile
from support import settle

COST = CostEstimate(fixed_s=0.008, per_item_s=0.00025)
CLASSES = ClassConfig(
    classes=(
        WorkClass(name="interactive", weight=1.0, queue_share=0.25),
        WorkClass(name="bulk", weight=1.0, queue_share=0.75, max_wait_s=0.01),
    ),
    tenant_share=0.5,
)
STREAMS = [
    Stream(work_class="interactive", rate=150, timeout_s=0.04, arrivals="poisson", seed=1),
    Stream(work_class="bulk", tenant="a", rate=1000, timeout_s=0.3, arrivals="poisson", seed=2),
    Stream(work_class="bulk", tenant="b", rate=600, timeout_s=0.3, arrivals="poisson", seed=3),
]
DURATION_S = 0.3


async def run_batcher(config: BatchConfig) -> list[tuple[int, int, dict[str, int], list[float]]]:
    clock = ManualClock()

    async def model(xs: Sequence[object]) -> list[object]:
        await clock.sleep(COST.fixed_s + len(xs) * COST.per_item_s)
        return list(xs)

    schedule = sorted(
        (t, k)
        for k, s in enumerate(STREAMS)
        for t in arrival_times(rate=s.rate, duration_s=DURATION_S, arrivals=s.arrivals, seed=s.seed)
    )
    latencies: list[list[float]] = [[] for _ in STREAMS]
    timed_out = [0] * len(STREAMS)
    rejected: list[dict[str, int]] = [{} for _ in STREAMS]

    async def wait(k: int, ticket: Ticket[object], at: float) -> None:
        try:
            await ticket
        except DeadlineExceeded:
            timed_out[k] += 1
        else:
            latencies[k].append(clock.now() - at)

    async def step_to(when: float) -> None:
        while (t := clock.next_timer()) is not None and t < when:
            advance_exactly(clock, t)
            await settle(10)
        advance_exactly(clock, when)
        await settle(10)

    batcher: Batcher[object] = Batcher(model, config, clock=clock, classes=CLASSES)
    tasks = []
    for i, (at, k) in enumerate(schedule):
        await step_to(at)
        s = STREAMS[k]
        assert s.timeout_s is not None
        try:
            ticket = batcher.submit_nowait(
                i, deadline=at + s.timeout_s, priority=s.work_class, tenant=s.tenant
            )
        except Rejected as exc:
            rejected[k][exc.reason] = rejected[k].get(exc.reason, 0) + 1
            continue
        tasks.append(asyncio.ensure_future(wait(k, ticket, at)))
        await settle(10)
    while not all(t.done() for t in tasks) or batcher.statistics().running_batches:
        t = clock.next_timer()
        assert t is not None
        await step_to(t)
    await batcher.shutdown()
    return [
        (len(latencies[k]), timed_out[k], rejected[k], sorted(latencies[k]))
        for k in range(len(STREAMS))
    ]


@pytest.mark.parametrize("admission", [True, False])
async def test_every_class_and_tenant_gets_the_same_outcomes(admission: bool) -> None:
    config = BatchConfig(max_batch_size=16, max_wait_s=0.002, queue_size=32, admission=admission)
    got = await run_batcher(config)
    want = simulate_mix(
        config=config, cost=COST, streams=STREAMS, duration_s=DURATION_S, classes=CLASSES
    )
    for (ok, timed_out, rejected, lat), f in zip(got, want.streams, strict=True):
        assert (ok, timed_out, rejected) == (f.ok, f.timed_out, f.rejected), f.stream.label
        assert percentile(lat, 0.5) * 1e3 == pytest.approx(f.p50_ms, abs=1e-6)
        assert percentile(lat, 0.99) * 1e3 == pytest.approx(f.p99_ms, abs=1e-6)
    # The overload shows: bulk work is refused, and queries are served.
    assert sum(f.rejected_total for f in want.streams[1:]) > 0
    assert want.streams[0].ok > 0
