"""A process's view of the machine: a free port, CPU seconds, a bounded wait."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from collections.abc import Callable

__all__ = [
    "children",
    "cpu_pressure_s",
    "cpu_s",
    "free_port",
    "machine_cpu_s",
    "process_cpu_s",
    "wait_until",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) of one live process so far; 0 if it is gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        # utime and stime are fields 14 and 15 of stat(5); after the ")" they are 12 and 13.
        fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a server's workers)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]
    return []


def cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of its live children (a server's workers)."""
    return sum(process_cpu_s(p) for p in [pid, *children(pid)])


def machine_cpu_s() -> float:
    """CPU seconds every core of the machine has been busy since boot; NaN without ``/proc``.

    Busy is user, nice, system, interrupts and steal (``/proc/stat``'s first line), so the
    difference over a run less the CPU of the processes one knows is what the others took.
    """
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return math.nan
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cpu_pressure_s() -> float:
    """Seconds runnable tasks have waited for a CPU since boot (Linux PSI); NaN elsewhere."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
    except OSError:
        return math.nan
    return int(some[-1].partition("=")[2]) / 1e6


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.02) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False).

    A test that orders events with real sleeps passes only while the machine is idle; this
    returns as soon as the condition holds, and the bound is generous (a busy machine is
    slow, not wrong). Blocks the calling thread.
    """
    end = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval_s)
