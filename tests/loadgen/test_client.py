"""The HTTP pool's connection attempts belong to the task group of its ``running`` block.

No server: the pool's ``_connect`` is replaced by one that fails or never ends, so what is
checked is only who owns a dial: it cannot outlive the block, and an error the pool does
not handle ends the block instead of leaving its request to wait.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from batchserve.loadgen.client import Connection, Pool


class Dialling(Pool):
    """A pool whose connection attempts fail with ``error``, or never end (None)."""

    def __init__(self, error: Exception | None) -> None:
        self.ended: list[tuple[Any, ...]] = []
        self.attempts = 0
        self.error = error
        super().__init__(
            loop=asyncio.get_running_loop(),
            host="127.0.0.1",
            port=9,
            max_connections=4,
            max_dials=2,
            data=lambda index: b"",
            now=time.monotonic,
            on_sent=lambda index, t: None,
            on_done=lambda *ended: self.ended.append(ended),
        )

    async def _connect(self) -> Connection:
        self.attempts += 1
        if self.error is not None:
            raise self.error
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_dial_that_fails_as_a_connection_does_fails_the_oldest_waiter() -> None:
    pool = Dialling(ConnectionRefusedError("refused"))
    async with pool.running():
        pool.submit(0)
        for _ in range(5):
            await asyncio.sleep(0)
        pool.close()
    assert pool.attempts >= 1
    assert pool.ended[0][:4] == (0, 0, "connect: ConnectionRefusedError", None)
    assert math.isnan(pool.ended[0][4])


async def test_a_dial_that_raises_what_the_pool_does_not_handle_ends_the_block() -> None:
    pool = Dialling(ValueError("not a network error"))
    with pytest.RaisesGroup(pytest.RaisesExc(ValueError, match="not a network error")):
        async with asyncio.timeout(5), pool.running():
            pool.submit(0)
            await asyncio.Event().wait()  # cancelled by the group when the dial fails
    assert pool.ended == []


async def test_closing_cancels_the_dials_and_leaving_the_block_waits_for_them() -> None:
    pool = Dialling(None)
    async with pool.running():
        for index in range(3):
            pool.submit(index)
        await asyncio.sleep(0)
        assert pool.attempts == 2  # max_dials
        dials = set(pool._dials)
        pool.close()
        assert not any(task.done() for task in dials)  # cancelled, not yet ended
    assert all(task.cancelled() for task in dials)
    assert pool._dials == set()


async def test_a_request_that_must_dial_outside_the_block_is_refused() -> None:
    pool = Dialling(None)
    with pytest.raises(RuntimeError, match="submits requests within"):
        pool.submit(0)
