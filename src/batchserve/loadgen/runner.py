"""Run a whole load test: split the schedule among sender processes, start them together.

Theory of operation. :func:`run_load` computes the schedule once (seeded, fixed in advance)
and deals it round-robin to ``processes`` shares, so each process sends every N-th request
and the union is exactly the schedule. With one process the share is sent on an event loop
in the calling thread. With several, each is a ``spawn``-ed child that encodes its bodies,
opens its warm connections and says it is ready; the coordinator then picks one start instant
(``time.monotonic()`` is the same clock in every process on Linux) a little in the future and
sends it to all, so every request keeps its absolute scheduled time whichever process sends
it. Children stream :class:`~batchserve.loadgen.sender.Progress` snapshots and finally their
:class:`~batchserve.loadgen.sender.ShareResult`; the coordinator merges them and builds the
report. Any failure in a child stops the run and is raised in the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from batchserve.loadgen.config import LoadConfig
from batchserve.loadgen.report import LoadReport, Records, build_report, merge
from batchserve.loadgen.sender import Progress, Sender, Share, ShareResult, cpu_seconds, now

__all__ = ["LoadRun", "loop_factory", "run_load", "run_mix", "split"]

#: Seconds between the last "ready" and the common start instant.
START_MARGIN_S = 0.05
#: Seconds a child may take to start, encode its requests and connect.
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadRun:
    """A finished run: its report and every request's record.

    Attributes:
        report: the figures.
        records: per request, in schedule order.
        start_at: the start instant (``time.monotonic()``): request ``i`` was due at
            ``start_at + records.offset_s[i]``.
    """

    report: LoadReport
    records: Records
    start_at: float


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop to use: uvloop's where installed (less CPU per request), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def split(config: LoadConfig, schedule: list[float]) -> list[Share]:
    """Deal ``schedule`` round-robin into ``config.processes`` shares."""
    k = config.processes
    per_process = max(1, config.max_connections // k)
    return [
        Share(
            config=config,
            offsets=schedule[p::k],
            indices=list(range(p, len(schedule), k)),
            max_connections=per_process,
        )
        for p in range(k)
    ]


def run_load(
    config: LoadConfig,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    progress_every_s: float = 0.25,
) -> LoadRun:
    """Run ``config`` to the end and report. Blocks the calling thread.

    Args:
        config: what to send.
        on_progress: called every ``progress_every_s`` with the counters summed over
            processes (from the calling thread).
        progress_every_s: the progress period in seconds.

    Raises:
        OSError: the server cannot be reached before the start.
        RuntimeError: a sender process failed.
    """
    shares = split(config, config.schedule())
    if config.processes == 1:
        result = _run_here(shares[0], on_progress, progress_every_s)
        merged = merge([result])
    else:
        results, coordinator_cpu_s = _run_children(shares, on_progress, progress_every_s)
        merged = merge(results, extra_cpu_s=coordinator_cpu_s)
    return LoadRun(
        report=build_report(config, merged), records=merged.records, start_at=merged.start_at
    )


def run_mix(configs: Sequence[LoadConfig], *, progress_every_s: float = 0.25) -> list[LoadRun]:
    """Run several streams at once, one sender process each, from one start; report each.

    Each config is one stream of mixed traffic (its own rate, inputs, deadline, class and
    tenant); all start at the same instant. Blocks the calling thread.

    Raises:
        OSError: the server cannot be reached before the start.
        RuntimeError: a sender process failed.
    """
    shares = [
        Share(
            config=c,
            offsets=(schedule := c.schedule()),
            indices=list(range(len(schedule))),
            max_connections=c.max_connections,
        )
        for c in configs
    ]
    results, _ = _run_children(shares, None, progress_every_s)
    runs = []
    for c, r in zip(configs, results, strict=True):
        merged = merge([r])
        runs.append(
            LoadRun(
                report=build_report(c, merged), records=merged.records, start_at=merged.start_at
            )
        )
    return runs


def _raise_fd_limit() -> None:
    """Let this process open as many connections as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):  # not permitted: keep the soft one
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _run_here(
    share: Share,
    on_progress: Callable[[Progress], None] | None,
    progress_every_s: float,
) -> ShareResult:
    _raise_fd_limit()

    async def main() -> ShareResult:
        sender = Sender(share, thread_only_cpu=True)
        await sender.prepare()
        return await sender.run(
            now() + START_MARGIN_S, on_progress=on_progress, progress_every_s=progress_every_s
        )

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main())


def _child(conn: Connection, progress_every_s: float) -> None:
    """A sender process: get its share, prepare, say ready, wait for the start, send, report."""
    try:
        # The share comes over our pipe, not as a spawn argument: spawn blocks writing a
        # large argument to a child that died before reading it.
        share: Share = conn.recv()
        _raise_fd_limit()
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            sender = Sender(share)
            runner.run(sender.prepare())
            conn.send(("ready", None))
            kind, start_at = conn.recv()
            if kind != "start":
                return
            result = runner.run(
                sender.run(
                    start_at,
                    on_progress=lambda p: conn.send(("progress", p)),
                    progress_every_s=progress_every_s,
                )
            )
        conn.send(("result", result))
    except BaseException as exc:
        with contextlib.suppress(OSError):  # the coordinator may be gone
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _run_children(
    shares: list[Share],
    on_progress: Callable[[Progress], None] | None,
    progress_every_s: float,
) -> tuple[list[ShareResult], float]:
    ctx = multiprocessing.get_context("spawn")
    conns: list[Connection] = []
    procs: list[Any] = []
    try:
        for share in shares:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_child, args=(theirs, progress_every_s), daemon=True)
            proc.start()
            theirs.close()
            conns.append(mine)
            procs.append(proc)
            try:
                mine.send(share)
            except OSError:
                raise RuntimeError(f"sender process {len(procs) - 1} failed to start") from None
        for i, conn in enumerate(conns):
            if not conn.poll(READY_TIMEOUT_S):
                raise RuntimeError(f"sender process {i} was not ready in {READY_TIMEOUT_S:g} s")
            kind, payload = _recv(conn, i)
            if kind != "ready":
                raise RuntimeError(f"sender process {i} failed: {payload}")
        start_at = now() + START_MARGIN_S
        cpu0 = cpu_seconds(thread_only=True)
        for conn in conns:
            conn.send(("start", start_at))
        latest: dict[int, Progress] = {}
        results: dict[int, ShareResult] = {}
        index = {id(c): i for i, c in enumerate(conns)}
        while len(results) < len(conns):
            waiting = [c for i, c in enumerate(conns) if i not in results]
            for ready in wait(waiting, timeout=progress_every_s):
                assert isinstance(ready, Connection)
                i = index[id(ready)]
                kind, payload = _recv(ready, i)
                if kind == "progress":
                    latest[i] = payload
                elif kind == "result":
                    results[i] = payload
                else:
                    raise RuntimeError(f"sender process {i} failed: {payload}")
            if on_progress is not None and latest:
                total = Progress()
                for p in latest.values():
                    total = total + p
                on_progress(total)
        coordinator_cpu_s = cpu_seconds(thread_only=True) - cpu0
        for proc in procs:
            proc.join(timeout=10)
        return [results[i] for i in range(len(conns))], coordinator_cpu_s
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for conn in conns:
            conn.close()


def _recv(conn: Connection, i: int) -> tuple[str, Any]:
    try:
        message: tuple[str, Any] = conn.recv()
    except EOFError:
        raise RuntimeError(f"sender process {i} exited without a result") from None
    return message
