"""One process's share of an open-loop run: send at the scheduled instants, record answers.

Theory of operation. A :class:`Share` is a sorted list of absolute-schedule offsets and the
global request indices they belong to. :meth:`Sender.prepare` encodes every distinct request
body and opens a few warm connections; :meth:`Sender.run` is then given the common start
instant ``start_at`` (a ``time.monotonic()`` value, shared by every process of the run) and:

1. a dispatch callback wakes at the next scheduled instant, submits every request whose
   instant has come (``start_at + offset <= now``) to the :class:`~batchserve.loadgen.client.Pool`
   (never before its instant), and re-arms itself for the next one. Answers never pace it:
   the pool opens a new connection rather than make a request wait for a busy one;
2. each request's *lag* is its write time minus its scheduled instant: its *dispatch lag*
   (until this process handed it to the pool: the generator's own timing and CPU) plus any
   wait for a connection. Its *latency* is its answer's arrival minus its scheduled instant,
   so time spent queued anywhere, in this process included, is counted (no coordinated
   omission);
3. a sweeper abandons requests still pending ``give_up_s`` after their scheduled instant
   (status 0, ``client_timeout``), so nothing hangs;
4. a progress callback gets a :class:`Progress` snapshot every ``progress_every_s``;
5. the run ends when every request has ended; :class:`ShareResult` holds the raw records.

The dispatch callback is woken by a :mod:`~batchserve.loadgen.timer` (a ``timerfd`` on Linux:
tens of µs of precision; event-loop timers only have milliseconds).
"""

from __future__ import annotations

import asyncio
import math
import resource
import socket
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Protocol

from batchserve.errors import ConfigError
from batchserve.loadgen.client import Pool, PoolStatistics
from batchserve.loadgen.config import LoadConfig
from batchserve.loadgen.protocol import (
    CLIENT_TIMEOUT,
    Outcome,
    classify,
    encode_request,
    request_texts,
    split_header_list,
    with_deadline,
)
from batchserve.loadgen.timer import WakeTimer, make_timer

__all__ = ["Progress", "Sender", "Share", "ShareResult", "cpu_seconds"]

#: The clock shared by every process of a run (system-wide on Linux).
now = time.monotonic


def cpu_seconds(*, thread_only: bool = False) -> float:
    """CPU time (user + system) of this process, or of the calling thread only.

    Per-thread figures need Linux; elsewhere the whole process is counted.
    """
    thread = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    who = thread if thread_only else resource.RUSAGE_SELF
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


@dataclass(frozen=True, slots=True, kw_only=True)
class Share:
    """The part of a run's schedule one process sends.

    Attributes:
        config: the run's settings.
        offsets: scheduled send times in seconds from the start, sorted.
        indices: the global index of each request (same length as ``offsets``).
        max_connections: this process's cap on open connections.
    """

    config: LoadConfig
    offsets: list[float]
    indices: list[int]
    max_connections: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """Counters of a run in progress (summed over processes by the caller).

    Attributes:
        elapsed_s: seconds since the start instant.
        scheduled: requests whose instant has passed.
        sent: requests written.
        ok, rejected, timed_out, errors: requests ended so far, by outcome.
        pending: requests submitted and not yet ended.
        lag_max_s: the largest send lag so far.
    """

    elapsed_s: float = 0.0
    scheduled: int = 0
    sent: int = 0
    ok: int = 0
    rejected: int = 0
    timed_out: int = 0
    errors: int = 0
    pending: int = 0
    lag_max_s: float = 0.0

    def __add__(self, other: Progress) -> Progress:
        return Progress(
            elapsed_s=max(self.elapsed_s, other.elapsed_s),
            scheduled=self.scheduled + other.scheduled,
            sent=self.sent + other.sent,
            ok=self.ok + other.ok,
            rejected=self.rejected + other.rejected,
            timed_out=self.timed_out + other.timed_out,
            errors=self.errors + other.errors,
            pending=self.pending + other.pending,
            lag_max_s=max(self.lag_max_s, other.lag_max_s),
        )


@dataclass(slots=True, kw_only=True)
class ShareResult:
    """The raw records of one share; lists are parallel to the share's ``offsets``.

    Attributes:
        indices: global request indices.
        offsets: scheduled send times from the start, seconds.
        lag_s: write time minus scheduled time (NaN if never written).
        dispatch_lag_s: hand-over to the pool minus scheduled time.
        latency_s: answer time minus scheduled time (NaN if no answer).
        server_s: the server's own account of each request's time, arrival to answer
            (``Server-Timing: total``; NaN where it sent none).
        status: HTTP status, 0 when no response came.
        reasons: ``X-Reason`` (or the client's reason) of requests that did not succeed,
            by position.
        items: inputs answered in successful responses that carried ``X-Batch-Id``.
        batch_ids: the distinct batch ids seen.
        start_at: the start instant (``time.monotonic()``).
        end_at: when the last request ended.
        cpu_s: CPU seconds this sender used from the start instant to the end.
        pool: the connection pool's counters.
    """

    indices: list[int]
    offsets: list[float]
    lag_s: list[float]
    dispatch_lag_s: list[float]
    latency_s: list[float]
    status: list[int]
    server_s: list[float] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)
    items: int = 0
    batch_ids: set[bytes] = field(default_factory=set)
    start_at: float = 0.0
    end_at: float = 0.0
    cpu_s: float = 0.0
    pool: PoolStatistics = field(default_factory=PoolStatistics)


class Wire(Protocol):
    """What the sender needs of a client.

    The HTTP :class:`~batchserve.loadgen.client.Pool` or the gRPC
    :class:`~batchserve.loadgen.grpc_client.GrpcPool`.
    """

    @property
    def pending(self) -> int:
        """Requests submitted and not yet ended."""

    def statistics(self) -> PoolStatistics:
        """A snapshot of the connection counters."""

    async def warm(self, count: int) -> None:
        """Connect before the run (raises OSError naming the address)."""

    def running(self) -> AbstractAsyncContextManager[None]:
        """The block of the run: a task group owns the client's tasks, none outlives it."""

    def submit(self, index: int) -> None:
        """Send request ``index`` now (within ``running``)."""

    def abandon(self, index: int, reason: str) -> bool:
        """End request ``index`` now with status 0 and ``reason``, if it has not ended."""

    def close(self) -> None:
        """Stop sending; call when no request is pending."""

    async def wait_closed(self) -> None:
        """Wait until closing has finished."""


def _grpc() -> ModuleType:
    try:
        from batchserve.loadgen import grpc_client
    except ImportError as exc:
        raise ConfigError(
            f"a grpc:// url needs grpcio: pip install 'batchserve[grpc]' ({exc})"
        ) from None
    return grpc_client


class Sender:
    """Sends one :class:`Share` open loop on the running event loop.

    Args:
        share: what to send.
        thread_only_cpu: measure the CPU of the calling thread only (when the sender shares
            its process with other work, such as a test server), not of the whole process.
    """

    def __init__(self, share: Share, *, thread_only_cpu: bool = False) -> None:
        self._share = share
        self._config = share.config
        self._thread_only_cpu = thread_only_cpu
        n = len(share.offsets)
        self._n = n
        self._lag = [math.nan] * n
        self._dispatch_lag = [math.nan] * n
        self._latency = [math.nan] * n
        self._server = [math.nan] * n
        self._status = [0] * n
        self._reasons: dict[int, str] = {}
        self._batch_ids: set[bytes] = set()
        self._items = 0
        self._due: list[float] = []
        self._bodies: dict[int, bytes] = {}
        self._body_of: list[bytes] = []
        self._pool: Wire | None = None
        self._ok = self._rejected = self._timed_out = self._errors = 0
        self._sent = 0
        self._ended = 0
        self._next = 0
        self._lag_max = 0.0
        self._give_up: deque[tuple[float, int]] = deque()
        self._finished: asyncio.Future[None] | None = None
        self._timer: WakeTimer | None = None
        self._start_at = 0.0
        self._epoch_offset = 0.0
        self._give_up_s = share.config.give_up_s

    async def prepare(self) -> None:
        """Encode the request bodies, resolve the host, and open warm connections.

        Raises:
            OSError: the server cannot be reached.
        """
        cfg = self._config
        k = cfg.inputs_per_request
        ntexts = len(cfg.texts)
        # Request i starts at text (i * k) % ntexts: at most ntexts distinct bodies.
        encode = encode_request
        if cfg.target.scheme == "grpc":
            encode = _grpc().encode_infer
        for gi in self._share.indices:
            start = (gi * k) % ntexts
            body = self._bodies.get(start)
            if body is None:
                body = encode(cfg, request_texts(cfg, gi))
                self._bodies[start] = body
            self._body_of.append(body)
        loop = asyncio.get_running_loop()
        target = cfg.target
        infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        host = str(infos[0][4][0])
        body_of = self._body_of
        data: Callable[[int], bytes] = body_of.__getitem__
        if target.scheme == "grpc":
            self._pool = self._grpc_pool(host, target.port)
            await self._pool.warm(min(cfg.warm_connections, max(self._n, 1)))
            return
        if cfg.timeout_s is not None and cfg.absolute_deadline:
            data = self._with_deadline
        self._pool = Pool(
            loop=loop,
            host=host,
            port=target.port,
            max_connections=self._share.max_connections,
            max_dials=cfg.max_dials,
            data=data,
            now=now,
            on_sent=self._on_sent,
            on_done=self._on_done,
        )
        await self._pool.warm(min(cfg.warm_connections, max(self._n, 1)))

    async def run(
        self,
        start_at: float,
        *,
        on_progress: Callable[[Progress], None] | None = None,
        progress_every_s: float = 0.25,
    ) -> ShareResult:
        """Send the share from ``start_at`` (a ``time.monotonic()`` instant) until all end.

        Blocks (asynchronously) until every request has been answered or abandoned.
        Cancelling it abandons the run (connections are closed).
        """
        if self._pool is None:
            await self.prepare()
        pool = self._pool
        assert pool is not None
        loop = asyncio.get_running_loop()
        self._start_at = start_at
        self._due = [start_at + off for off in self._share.offsets]
        timeout_s = self._config.timeout_s or 0.0
        self._epoch_offset = time.time() - now() + timeout_s
        self._finished = loop.create_future()
        cpu0 = cpu_seconds(thread_only=self._thread_only_cpu)
        timers: list[asyncio.TimerHandle] = []

        def sweep() -> None:
            t = now()
            queue = self._give_up
            while queue and queue[0][0] <= t:
                _, pos = queue.popleft()
                pool.abandon(pos, CLIENT_TIMEOUT)
            timers[0] = loop.call_later(0.01 if queue else 0.05, sweep)

        def report() -> None:
            if on_progress is not None:
                on_progress(self.progress())
            timers[1] = loop.call_later(progress_every_s, report)

        async with pool.running():
            timers.append(loop.call_later(0.05, sweep))
            timers.append(loop.call_later(progress_every_s, report))
            self._timer = make_timer(loop, self._dispatch)
            self._timer.arm(self._due[0] if self._n else start_at)
            if self._n == 0:
                self._finished.set_result(None)
            try:
                await self._finished
            finally:
                for timer in timers:
                    timer.cancel()
                self._timer.close()
                if not self._finished.done():  # cancelled: abandon what is left
                    self._next = self._n
                    for pos in range(self._n):
                        pool.abandon(pos, "cancelled")
                pool.close()
            end_at = max(now(), start_at)
        await pool.wait_closed()  # let closing finish before the loop ends
        cpu_s = cpu_seconds(thread_only=self._thread_only_cpu) - cpu0
        if on_progress is not None:
            on_progress(self.progress())
        return ShareResult(
            indices=list(self._share.indices),
            offsets=list(self._share.offsets),
            lag_s=self._lag,
            dispatch_lag_s=self._dispatch_lag,
            latency_s=self._latency,
            status=self._status,
            server_s=self._server,
            reasons=self._reasons,
            items=self._items,
            batch_ids=self._batch_ids,
            start_at=start_at,
            end_at=end_at,
            cpu_s=cpu_s,
            pool=pool.statistics(),
        )

    def progress(self) -> Progress:
        """The counters now."""
        t = now()
        return Progress(
            elapsed_s=max(0.0, t - self._start_at),
            scheduled=self._next,
            sent=self._sent,
            ok=self._ok,
            rejected=self._rejected,
            timed_out=self._timed_out,
            errors=self._errors,
            pending=self._pool.pending if self._pool is not None else 0,
            lag_max_s=self._lag_max,
        )

    # -- the hot path ------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Submit every request whose instant has come, then re-arm for the next one."""
        due = self._due
        n = self._n
        i = self._next
        pool = self._pool
        assert pool is not None
        t = now()
        give_up = self._give_up
        give_up_s = self._give_up_s
        dispatch_lag = self._dispatch_lag
        while i < n and due[i] <= t:
            give_up.append((due[i] + give_up_s, i))
            dispatch_lag[i] = t - due[i]
            pool.submit(i)
            i += 1
        self._next = i
        if i < n:
            # A wake that comes early finds nothing due and re-arms: never send early.
            assert self._timer is not None
            self._timer.arm(due[i])
        elif self._ended == n and self._finished is not None and not self._finished.done():
            self._finished.set_result(None)

    def _grpc_pool(self, host: str, port: int) -> Wire:
        grpc_client = _grpc()
        metadata: tuple[tuple[str, str], ...] = grpc_client.infer_metadata(self._config)
        key = grpc_client.DEADLINE_KEY
        with_deadline = bool(metadata) and metadata[-1][0] == key
        head = metadata[:-1] if with_deadline else metadata

        def get_metadata(pos: int) -> tuple[tuple[str, str], ...]:
            if not with_deadline:
                return head
            # As over HTTP: the scheduled instant plus the timeout, on the wall clock.
            return (*head, (key, f"{self._due[pos] + self._epoch_offset:.6f}"))

        return grpc_client.GrpcPool(  # type: ignore[no-any-return]
            host=host,
            port=port,
            data=self._body_of.__getitem__,
            metadata=get_metadata,
            now=now,
            on_sent=self._on_sent,
            on_done=self._on_done,
        )

    def _with_deadline(self, pos: int) -> bytes:
        # The request's absolute deadline: its scheduled instant plus its timeout, on the
        # wall clock (the monotonic schedule mapped through the offset taken at the start).
        return with_deadline(self._body_of[pos], self._due[pos] + self._epoch_offset)

    def _on_sent(self, pos: int, t: float) -> None:
        lag = t - self._due[pos]
        self._lag[pos] = lag
        self._sent += 1
        if lag > self._lag_max:
            self._lag_max = lag

    def _on_done(
        self,
        pos: int,
        status: int,
        reason: str | None,
        batch_ids: bytes | None,
        server_s: float,
        t: float,
    ) -> None:
        self._latency[pos] = t - self._due[pos]
        self._server[pos] = server_s
        self._status[pos] = status
        outcome = classify(status, reason)
        if outcome is Outcome.OK:
            self._ok += 1
            if batch_ids is not None:
                if b"," in batch_ids:
                    ids = split_header_list(batch_ids)
                    self._items += len(ids)
                    self._batch_ids.update(ids)
                else:
                    self._items += 1
                    self._batch_ids.add(batch_ids.strip())
        else:
            self._reasons[pos] = reason or ""
            if outcome is Outcome.REJECTED:
                self._rejected += 1
            elif outcome is Outcome.TIMED_OUT:
                self._timed_out += 1
            else:
                self._errors += 1
        self._ended += 1
        if (
            self._ended == self._n
            and self._next == self._n
            and self._finished is not None
            and not self._finished.done()
        ):
            self._finished.set_result(None)
