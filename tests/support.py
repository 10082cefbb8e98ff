"""Waiting for an event in tests, instead of sleeping and hoping it happened; metric values.

A test that orders events with real sleeps passes only while the machine is idle. These
poll a condition with a bound instead: they return as soon as it holds, and the bound is
generous (a busy machine is slow, not wrong).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.02) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False)."""
    end = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval_s)


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """:func:`wait_until` on an event loop: polls between loop iterations, never blocks it."""
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
