"""What the in-process tests share: waiting for an event on the loop (instead of sleeping
and hoping it happened) and a metric's value. Waiting from a thread, and reading raw
HTTP/1.1 off a socket, are :mod:`batchserve_testing`'s (the benchmarks use them too).

A test that orders events with real sleeps passes only while the machine is idle. These
poll a condition with a bound instead: they return as soon as it holds, and the bound is
generous (a busy machine is slow, not wrong).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families


async def settle(turns: int = 20) -> None:
    """Let the event loop run ``turns`` iterations: callbacks and tasks that are ready run."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """:func:`batchserve_testing.process.wait_until` on an event loop: never blocks it."""
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= end:
            return False
        await asyncio.sleep(0.001)
    return True


def metric_value(exposition: str, name: str) -> float:
    """The sum of the samples called ``name`` in a Prometheus text exposition (0: none)."""
    return sum(
        s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name
    )


#: Why a test marked ``gpu`` is skipped where no CUDA device is (``-ra`` prints it).
NO_CUDA = (
    "no CUDA device here (torch.cuda.is_available() is False): bench/gpu/run.sh runs the "
    "tests marked gpu on a machine with one"
)


def cuda_here() -> bool:
    """Whether torch is installed and sees a CUDA device (imports torch: call it lazily)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())
