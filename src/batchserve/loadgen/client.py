"""A small HTTP/1.1 keep-alive client built for open-loop load: one request per connection.

Why not httpx or aiohttp: at 10,000 requests per second a general client's per-request
machinery (a task, a future, a header object, a body decoder) costs more CPU than this
machine has to spare, and its pool makes a request wait for a free connection, which paces
sends by answers: closed loop again. Here a request is a pre-encoded ``bytes`` written on a
connection of its own; responses are parsed by ``httptools`` (C) through callbacks, and only
the headers the report needs are kept. No task or future is created per request.

How a request finds a connection (:meth:`Pool.submit`): an idle connection if there is one
(most recently used first); otherwise it joins a FIFO of waiting requests and a new
connection is dialled for it. Whichever becomes free first, a dialled connection or one
whose answer just came, takes the oldest waiter. Two bounds keep an overloaded server from
being buried under connection attempts, which cost it several times more than a request
(about 250 µs each here) and would feed on themselves: at most ``max_dials`` attempts at
once, and at most ``max_connections`` open. Time spent waiting counts in the request's lag
and latency (both run from its scheduled instant), and the waits are counted.

A request ends exactly once: answered, failed (its connection broke, or a dial failed: each
failed dial fails the oldest waiter, so an unreachable server cannot hang the run) or
abandoned (:meth:`Pool.abandon`, at the client's give-up time). A connection that had
already served a request and dies before the first byte of its answer (the keep-alive race
with a server closing it) gets its request retried once.

Requests are submitted within :meth:`Pool.running`, whose task group owns the connection
attempts: none outlives the run, and one that fails in a way the pool does not handle ends
the run with its error rather than leaving its request to wait for the give-up time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import cast

import httptools

__all__ = ["SLOW_DIAL_S", "Completion", "Connection", "Pool", "PoolStatistics"]

#: A connection attempt slower than this is counted as slow: on a LAN or loopback it means
#: the server's listen backlog overflowed and the kernel is retransmitting the SYN (1 s).
SLOW_DIAL_S = 0.1

#: ``completion(index, status, reason, batch_ids, server_s, t_done)``: a request ended.
#: ``status`` is 0 when no response came; ``batch_ids`` is the raw ``X-Batch-Id`` value or
#: None; ``server_s`` is the server's own account of the request's time (``Server-Timing``'s
#: ``total``, arrival to answer), NaN when it sent none.
Completion = Callable[[int, int, "str | None", "bytes | None", float, float], None]


def server_total_s(value: bytes) -> float:
    """Seconds from a ``Server-Timing`` value's ``total;dur=<ms>`` metric (NaN: none)."""
    for metric in value.split(b","):
        name, _, params = metric.strip().partition(b";")
        if name.strip() == b"total":
            for param in params.split(b";"):
                key, _, dur = param.strip().partition(b"=")
                if key == b"dur":
                    try:
                        return float(dur) / 1e3
                    except ValueError:
                        return math.nan
    return math.nan


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying at most one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.index = -1  # the request in flight, -1 when idle
        self.served = 0  # responses completed on this connection
        self.got_bytes = False
        self._reason: str | None = None
        self._batch_ids: bytes | None = None
        self._server_s = math.nan
        self._t_recv = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport (asyncio callback)."""
        # uvloop's transports do not derive from asyncio.Transport but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, index: int, data: bytes) -> None:
        """Write request ``index``; the connection must be idle."""
        self.index = index
        self.got_bytes = False
        self._reason = None
        self._batch_ids = None
        self._server_s = math.nan
        assert self.transport is not None
        self._pool.sent(index)
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; stamp the time first, so parsing is not counted (asyncio)."""
        self._t_recv = self._pool.now()
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._pool.broken(self, f"protocol: {exc}")

    def on_header(self, name: bytes, value: bytes) -> None:
        """Keep ``X-Reason``, ``X-Batch-Id`` and ``Server-Timing`` (httptools callback)."""
        # The length test spares a lower() on every other header.
        size = len(name)
        if size == 10 and name.lower() == b"x-batch-id":
            self._batch_ids = value
        elif size == 8 and name.lower() == b"x-reason":
            self._reason = value.decode("latin-1").strip()
        elif size == 13 and name.lower() == b"server-timing":
            self._server_s = server_total_s(value)

    def on_message_complete(self) -> None:
        """Hand the finished response to the pool (httptools callback)."""
        self.served += 1
        self._pool.complete(
            self,
            self._parser.get_status_code(),
            self._reason,
            self._batch_ids,
            self._server_s,
            self._t_recv,
            self._parser.should_keep_alive(),
        )

    def connection_lost(self, exc: Exception | None) -> None:
        """Tell the pool (asyncio callback)."""
        self._pool.lost(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolStatistics:
    """What the pool did.

    Attributes:
        opened: connection attempts (including failed ones).
        failed: connection attempts that failed.
        open: connections open now.
        peak_open: the most connections open at once.
        waits: requests that found no idle connection and waited for one.
        cap_waits: of those, requests that arrived while ``max_connections`` were open.
        dial_waits: of those, requests that arrived while ``max_dials`` attempts were in
            progress (they wait for whichever connection frees or opens first).
        slow_dials: connection attempts that took longer than :data:`SLOW_DIAL_S`.
        max_dial_s: the longest connection attempt, in seconds.
        retries: requests resent after a kept-alive connection died under them.
    """

    opened: int = 0
    failed: int = 0
    open: int = 0
    peak_open: int = 0
    waits: int = 0
    cap_waits: int = 0
    dial_waits: int = 0
    slow_dials: int = 0
    max_dial_s: float = 0.0
    retries: int = 0

    @classmethod
    def pooled(cls, parts: Iterable[PoolStatistics]) -> PoolStatistics:
        """Several processes' pools as one: counts summed (peaks too), the longest dial."""
        parts = list(parts)
        return cls(
            **{f: sum(getattr(p, f) for p in parts) for f in _SUMMED},
            max_dial_s=max((p.max_dial_s for p in parts), default=0.0),
        )


_SUMMED = tuple(f for f in PoolStatistics.__dataclass_fields__ if f != "max_dial_s")


class Pool:
    """Connections to one server, opened on demand so that no request waits for an answer.

    Args:
        loop: the event loop.
        host: an address to connect to (resolve names before, once).
        port: the TCP port.
        max_connections: the cap on open connections (>= 1).
        max_dials: the cap on connection attempts in progress (>= 1).
        data: the bytes to write for a request index.
        now: the clock that stamps send and receive times, in seconds.
        on_sent: called with ``(index, t_sent)`` just before a request is written.
        on_done: called once per submitted request when it ends (see :data:`Completion`).
    """

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        max_connections: int,
        max_dials: int = 32,
        data: Callable[[int], bytes],
        now: Callable[[], float],
        on_sent: Callable[[int, float], None],
        on_done: Completion,
    ) -> None:
        self._loop = loop
        self._host = host
        self._port = port
        self._max = max_connections
        self._max_dials = max_dials
        self._data = data
        self.now = now
        self._on_sent = on_sent
        self._on_done = on_done
        self._idle: dict[Connection, None] = {}  # insertion-ordered: popitem() is LIFO
        self._inflight: dict[int, Connection] = {}
        # Waiting requests: a FIFO plus the set of those still waiting (an abandoned one is
        # dropped from the set and skipped when it reaches the front). A dict would do both,
        # but popping its first key costs a scan past every key deleted before it.
        self._waiting: deque[int] = deque()
        self._waiting_set: set[int] = set()
        # The connection attempts in progress: counted against the caps, cancelled by
        # ``close``. The task group of ``running`` owns them (awaits them, raises their
        # errors); this set only names them, as a task group cannot cancel its tasks.
        self._dials: set[asyncio.Task[None]] = set()
        self._group: asyncio.TaskGroup | None = None
        self._retried: set[int] = set()
        self._open = 0  # connected, not yet lost
        self._peak = 0
        self._opened = 0
        self._failed = 0
        self._waits = 0
        self._cap_waits = 0
        self._dial_waits = 0
        self._slow_dials = 0
        self._max_dial_s = 0.0
        self._closed = False

    def statistics(self) -> PoolStatistics:
        """A snapshot of the pool's counters."""
        return PoolStatistics(
            opened=self._opened,
            failed=self._failed,
            open=self._open,
            peak_open=self._peak,
            waits=self._waits,
            cap_waits=self._cap_waits,
            dial_waits=self._dial_waits,
            slow_dials=self._slow_dials,
            max_dial_s=self._max_dial_s,
            retries=len(self._retried),
        )

    @property
    def pending(self) -> int:
        """Requests submitted and not yet ended."""
        return len(self._inflight) + len(self._waiting_set)

    async def warm(self, count: int) -> None:
        """Open up to ``count`` idle connections now (before a run starts).

        Raises:
            OSError: the server cannot be reached; the message names the address.
        """
        count = min(count, self._max - self._open)
        if count <= 0:
            return
        self._opened += count
        results = await asyncio.gather(
            *(self._connect() for _ in range(count)), return_exceptions=True
        )
        for res in results:
            if isinstance(res, Connection):
                self._connected(res)
                if res.transport is not None and not res.transport.is_closing():
                    self._idle[res] = None
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            self._failed += len(failures)
            self.close()
            raise OSError(
                f"cannot connect to {self._host}:{self._port}: {failures[0]}"
            ) from failures[0]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The block within which requests are submitted: its task group owns the dials.

        Leaving it waits for the connection attempts in progress (:meth:`close`, called
        first, cancels them). A dial that raises what the pool does not handle (anything but
        ``OSError``) cancels the block and is raised from it.
        """
        async with asyncio.TaskGroup() as group:
            self._group = group
            yield

    def submit(self, index: int) -> None:
        """Send request ``index`` now on an idle connection, else queue it and dial.

        Within :meth:`running` only (a dial is a task of its group).
        """
        if self._idle:
            conn, _ = self._idle.popitem()
            self._inflight[index] = conn
            conn.send(index, self._data(index))
            return
        self._waits += 1
        if self._open + len(self._dials) >= self._max:
            self._cap_waits += 1
        elif len(self._dials) >= self._max_dials:
            self._dial_waits += 1
        self._waiting.append(index)
        self._waiting_set.add(index)
        self._dial_for_waiters()

    def abandon(self, index: int, reason: str) -> bool:
        """End request ``index`` now with status 0 and ``reason``, if it has not ended.

        A request in flight loses its connection (HTTP/1.1 cannot cancel it otherwise).

        Returns:
            True if the request was still pending.
        """
        conn = self._inflight.pop(index, None)
        if conn is not None:
            conn.index = -1
            if conn.transport is not None:
                conn.transport.abort()
        elif index in self._waiting_set:
            self._waiting_set.discard(index)
        else:
            return False
        self._on_done(index, 0, reason, None, math.nan, self.now())
        return True

    def close(self) -> None:
        """Close idle connections and stop dialling; call when no request is pending."""
        self._closed = True
        for task in list(self._dials):
            task.cancel()
        for conn in list(self._idle):
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()

    async def wait_closed(self) -> None:
        """Let the closed connections' callbacks run (before the loop ends)."""
        await asyncio.sleep(0)

    # -- called by connections -------------------------------------------------------------

    def sent(self, index: int) -> None:
        """A connection is about to write request ``index``."""
        self._on_sent(index, self.now())

    def complete(
        self,
        conn: Connection,
        status: int,
        reason: str | None,
        batch_ids: bytes | None,
        server_s: float,
        t_done: float,
        keep_alive: bool,
    ) -> None:
        """A response ended on ``conn``."""
        index = conn.index
        conn.index = -1
        if index >= 0 and self._inflight.pop(index, None) is conn:
            self._on_done(index, status, reason, batch_ids, server_s, t_done)
        if not keep_alive or self._closed:
            if conn.transport is not None:
                conn.transport.close()
            return
        self._use(conn)

    def broken(self, conn: Connection, reason: str) -> None:
        """The server sent something unparseable on ``conn``: fail its request, drop it."""
        index = conn.index
        conn.index = -1
        if index >= 0 and self._inflight.pop(index, None) is conn:
            self._on_done(index, 0, reason, None, math.nan, self.now())
        if conn.transport is not None:
            conn.transport.abort()

    def lost(self, conn: Connection) -> None:
        """``conn`` closed: retry or fail its request, and dial for waiters if needed."""
        self._open -= 1
        self._idle.pop(conn, None)
        index = conn.index
        conn.index = -1
        if index >= 0 and self._inflight.pop(index, None) is conn:
            if conn.served > 0 and not conn.got_bytes and index not in self._retried:
                self._retried.add(index)
                # Ahead of the other waiters: it was due before them.
                self._waiting.appendleft(index)
                self._waiting_set.add(index)
            else:
                self._on_done(index, 0, "connection_lost", None, math.nan, self.now())
        self._dial_for_waiters()

    # -- internals ---------------------------------------------------------------------------

    async def _connect(self) -> Connection:
        _, conn = await self._loop.create_connection(
            lambda: Connection(self), self._host, self._port
        )
        return conn

    def _connected(self, conn: Connection) -> None:
        self._open += 1
        if self._open > self._peak:
            self._peak = self._open

    def _use(self, conn: Connection) -> None:
        """Give a free connection to the oldest waiter, or park it."""
        nxt = self._pop_waiter()
        if nxt >= 0:
            self._inflight[nxt] = conn
            conn.send(nxt, self._data(nxt))
        else:
            self._idle[conn] = None

    def _dialled(self, t0: float) -> None:
        took = self.now() - t0
        if took > SLOW_DIAL_S:
            self._slow_dials += 1
        if took > self._max_dial_s:
            self._max_dial_s = took

    def _pop_waiter(self) -> int:
        """The oldest request still waiting, removed; -1 if none."""
        while self._waiting:
            index = self._waiting.popleft()
            if index in self._waiting_set:
                self._waiting_set.discard(index)
                return index
        return -1

    def _dial_for_waiters(self) -> None:
        if self._closed:
            return
        room = min(
            len(self._waiting_set) - len(self._dials),
            self._max_dials - len(self._dials),
            self._max - self._open - len(self._dials),
        )
        if room <= 0:
            return
        group = self._group
        if group is None:
            raise RuntimeError("a Pool submits requests within `async with pool.running()` only")
        for _ in range(room):
            self._opened += 1
            task = group.create_task(self._dial())
            self._dials.add(task)
            task.add_done_callback(self._dials.discard)

    async def _dial(self) -> None:
        t0 = self.now()
        try:
            conn = await self._connect()
        except OSError as exc:
            self._dialled(t0)
            self._failed += 1
            index = self._pop_waiter()  # each failed dial fails the oldest waiter
            if index >= 0:
                self._on_done(
                    index, 0, f"connect: {type(exc).__name__}", None, math.nan, self.now()
                )
            self._loop.call_soon(self._dial_for_waiters)
            return
        self._dialled(t0)
        self._connected(conn)
        if self._closed:
            if conn.transport is not None:
                conn.transport.close()
            return
        self._use(conn)
