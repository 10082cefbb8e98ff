"""What the tests share: waiting for an event (instead of sleeping and hoping it happened),
a metric's value, and reading raw HTTP/1.1 responses off a socket.

A test that orders events with real sleeps passes only while the machine is idle. These
poll a condition with a bound instead: they return as soon as it holds, and the bound is
generous (a busy machine is slow, not wrong).
"""

from __future__ import annotations

import asyncio
import socket
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


async def settle(turns: int = 20) -> None:
    """Let the event loop run ``turns`` iterations: callbacks and tasks that are ready run."""
    for _ in range(turns):
        await asyncio.sleep(0)


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


Response = tuple[int, dict[str, str], bytes]


def read_responses(sock: socket.socket, count: int) -> list[Response]:
    """``count`` HTTP/1.1 responses off ``sock``, in order: status, headers (lower-case
    names), body. Responses that arrive in one read (pipelined requests) are kept apart.

    Raises:
        ConnectionError: the connection closed before they were whole.
    """
    data = b""
    out: list[Response] = []
    while len(out) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            lines = data[:end].decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            stop = end + 4 + int(headers.get("content-length", "0"))
            if len(data) >= stop:
                out.append((int(lines[0].split()[1]), headers, data[end + 4 : stop]))
                data = data[stop:]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed after {len(out)} whole responses")
        data += chunk
    return out


def read_response(sock: socket.socket) -> Response:
    """One HTTP/1.1 response off ``sock`` (see :func:`read_responses`)."""
    return read_responses(sock, 1)[0]
