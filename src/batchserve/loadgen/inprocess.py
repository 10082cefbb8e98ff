"""Open-loop load in-process: a schedule of requests on a Batcher, no HTTP in between.

:func:`run_open_loop` sends requests on a schedule fixed in advance (constant spacing, or
Poisson with a seed), never paced by answers (a thread keeps the pace, to within about 0.1
ms), and measures each request's latency from its scheduled send time, so a stalled batcher
cannot hide its queue. :func:`run_seed_demo` runs the Go seed's table
(:mod:`batchserve.workload.seed`) this way, as ``batchserve demo`` does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from batchserve.batcher import Batcher, Ticket
from batchserve.clock import MonotonicClock
from batchserve.config import BatchConfig
from batchserve.errors import DeadlineExceeded, ModelError, Rejected
from batchserve.models.base import BatchFn
from batchserve.models.synthetic import SyntheticModel
from batchserve.workload.arrivals import arrival_times
from batchserve.workload.seed import (
    SEED_DURATION_S,
    SEED_FIXED_S,
    SEED_PER_ITEM_S,
    SEED_QUEUE,
    SEED_RATE,
    SEED_TIMEOUT_S,
    SeedRow,
    seed_scenarios,
)
from batchserve.workload.summary import LoadSummary, summarize

__all__ = ["run_open_loop", "run_seed_demo"]


async def run_open_loop(
    *,
    name: str,
    model: BatchFn,
    config: BatchConfig,
    schedule: list[float],
    timeout_s: float | None,
    duration_s: float,
    on_batcher: Callable[[Batcher[object]], None] | None = None,
) -> LoadSummary:
    """Drive a fresh Batcher with an open-loop schedule and summarize what callers saw.

    Args:
        name: the row's label.
        model: the batch function.
        config: the batcher's settings.
        schedule: send offsets in seconds from the start (see :func:`arrival_times`).
        timeout_s: every caller's deadline, from its scheduled send time.
        duration_s: the schedule's length, used for the offered rate.
        on_batcher: called with the batcher before the run (for inspection).

    Returns:
        The summary; ``ok_per_s`` counts successes over the wall time until the last answer.
    """
    clock = MonotonicClock()
    latencies: list[float] = []
    rejected: dict[str, int] = {}
    timed_out = 0
    errors = 0
    batcher: Batcher[object] = Batcher(model, config, clock=clock)
    if on_batcher is not None:
        on_batcher(batcher)

    async def wait(ticket: Ticket[object], scheduled: float) -> None:
        nonlocal timed_out, errors
        try:
            await ticket
        except DeadlineExceeded:
            timed_out += 1
        except ModelError:
            errors += 1
        else:
            latencies.append(clock.now() - scheduled)

    start = clock.now() + 0.01
    # Each admitted item's wait is a task of the group: leaving it waits for every answer.
    async with asyncio.TaskGroup() as waits:

        def submit(offset: float, at: float) -> None:
            try:
                ticket = batcher.submit_nowait(
                    offset, deadline=None if timeout_s is None else at + timeout_s
                )
            except Rejected as exc:
                rejected[exc.reason] = rejected.get(exc.reason, 0) + 1
                return
            waits.create_task(wait(ticket, at))

        await _send(schedule, start, clock, submit)
    elapsed = max(clock.now() - start, duration_s)
    await batcher.shutdown()
    stats = batcher.statistics()
    items = sum(size * count for size, count in stats.batch_sizes.items())
    return summarize(
        name=name,
        latencies_s=latencies,
        sent=len(schedule),
        duration_s=elapsed,
        offered_per_s=len(schedule) / duration_s if duration_s > 0 else 0.0,
        rejected_by_reason=rejected,
        timed_out=timed_out,
        errors=errors,
        items=items,
        batches=stats.batches,
        max_batch_size=config.max_batch_size,
        max_wait_s=config.max_wait_s,
    )


async def _send(
    schedule: list[float],
    start: float,
    clock: MonotonicClock,
    submit: Callable[[float, float], None],
) -> None:
    """Call ``submit(offset, start + offset)`` on the loop at each scheduled time.

    The pacing runs in a thread that sleeps until each send time and then hands the
    submission to the loop: the event loop's own timers fire up to 1 ms late (epoll waits in
    whole milliseconds), which would make every request late by 0.5 ms on average; a thread
    sleeps to within about 0.1 ms. Latency is still measured from the scheduled time.
    """
    loop = asyncio.get_running_loop()
    sent: asyncio.Future[None] = loop.create_future()
    stop = threading.Event()

    def finish() -> None:
        if not sent.done():
            sent.set_result(None)

    def pace() -> None:
        try:
            for offset in schedule:
                at = start + offset
                delay = at - clock.now()
                if delay > 0 and stop.wait(delay):
                    return
                loop.call_soon_threadsafe(submit, offset, at)
            loop.call_soon_threadsafe(finish)
        except RuntimeError:
            # The loop closed under us (the run was abandoned): nobody is waiting.
            return

    sender = threading.Thread(target=pace, name="batchserve-demo-sender", daemon=True)
    sender.start()
    try:
        await sent
    finally:
        stop.set()


async def run_seed_demo(
    *,
    rate: float = SEED_RATE,
    duration_s: float = SEED_DURATION_S,
    timeout_s: float = SEED_TIMEOUT_S,
    queue_size: int = SEED_QUEUE,
    fixed_s: float = SEED_FIXED_S,
    per_item_s: float = SEED_PER_ITEM_S,
    scenarios: list[SeedRow] | None = None,
) -> list[LoadSummary]:
    """Run every scenario of the seed's experiment in turn; one summary per row."""
    schedule = arrival_times(rate=rate, duration_s=duration_s)
    rows = []
    for sc in scenarios if scenarios is not None else seed_scenarios(queue_size=queue_size):
        rows.append(
            await run_open_loop(
                name=sc.name,
                model=SyntheticModel(fixed_s, per_item_s),
                config=sc.config,
                schedule=schedule,
                timeout_s=timeout_s,
                duration_s=duration_s,
            )
        )
    return rows
