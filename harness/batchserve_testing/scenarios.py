"""The reliability scenarios, as functions that run one and return its figures.

Each scenario starts a real server (``batchserve serve`` in a subprocess, serving the
fault-injecting model of :mod:`batchserve.models.faults`), drives it with open-loop load
(:func:`~batchserve_testing.harness.run_load`) or with special clients, and returns a
:class:`Figures`: what was offered, what came back, the server's own counters and its
memory. The tests call them with short CI durations and assert; ``bench/scenarios/stress.py`` calls
them with long durations and prints the table. Nothing here asserts except where a scenario
cannot go on (the server did not start, a queue never filled).

The model's cost is chosen so that its capacity, not the HTTP stack, is the bottleneck on a
2-core machine: :data:`OVERLOAD_COST` with batches of 8 takes 40 ms a pass, 200 items/s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from batchserve.loadgen.config import LoadConfig
from batchserve_testing.harness import (
    FAULTY,
    LoadRun,
    RequestCounts,
    Server,
    percentile,
    run_load,
    serve,
    unique_texts,
)
from batchserve_testing.process import wait_until
from batchserve_testing.rawhttp import read_response

#: The overload model: 20 ms + 2.5 ms per item; batches of 8 take 40 ms: 200 items/s.
OVERLOAD_COST = "fixed=20ms,per_item=2.5ms,dim=8"
OVERLOAD_BATCH = 8
OVERLOAD_CAPACITY = OVERLOAD_BATCH / (0.020 + OVERLOAD_BATCH * 0.0025)

#: A quicker model for the steady-load scenarios: 5 ms + 0.5 ms per item, batches of 16.
STEADY_COST = "fixed=5ms,per_item=0.5ms,dim=8"
STEADY_BATCH = 16
STEADY_CAPACITY = STEADY_BATCH / (0.005 + STEADY_BATCH * 0.0005)

#: Status 0 reasons that mean the request was never accepted (the listener was closed).
REFUSED_CONNECTION = "connect: "

#: How long before SIGTERM a shutdown scenario stalls the model, to have work queued.
STALL_LEAD_S = 0.3


@dataclasses.dataclass(slots=True, kw_only=True)
class Figures:
    """What one scenario run measured.

    Attributes:
        scenario: its name.
        duration_s: seconds of offered load.
        offered: requests sent.
        ok: requests answered 200.
        refusals: requests answered 429 or 503.
        lost: requests that got no answer at all (no status, and not a refused connection).
        ok_p99_s: p99 of the successes' latency from their scheduled send time.
        refusal_p99_s: p99 of the refusals' response time, from write to answer.
        rss_before: the server's resident bytes after warm-up (or at the start).
        rss_after: its resident bytes at the end.
        capacity: the model's capacity in items/s, when the scenario knows it.
        counts: the server's request counters at the end (None if it exited).
        run: the load run's records, when there was one.
        extra: scenario-specific figures.
    """

    scenario: str
    duration_s: float
    offered: int
    ok: int
    refusals: int
    lost: int
    ok_p99_s: float
    refusal_p99_s: float
    rss_before: int
    rss_after: int
    capacity: float | None = None
    counts: RequestCounts | None = None
    run: LoadRun | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def goodput(self) -> float:
        """Successes per second of offered load."""
        return self.ok / self.duration_s if self.duration_s else math.nan

    @property
    def offered_rate(self) -> float:
        """Requests per second offered."""
        return self.offered / self.duration_s if self.duration_s else math.nan

    @property
    def rss_growth(self) -> float:
        """Relative growth of the server's resident memory, after over before."""
        return self.rss_after / self.rss_before - 1.0


def _figures(scenario: str, run: LoadRun, **kwargs: Any) -> Figures:
    ok = run.indices(200)
    refusals = [i for i in range(run.n) if run.status[i] in (429, 503)]
    lost = [
        i
        for i in range(run.n)
        if run.status[i] == 0 and not run.reason(i).startswith(REFUSED_CONNECTION)
    ]
    return Figures(
        scenario=scenario,
        duration_s=run.config.duration_s,
        offered=run.n,
        ok=len(ok),
        refusals=len(refusals),
        lost=len(lost),
        ok_p99_s=percentile([run.latency_s(i) for i in ok], 99),
        refusal_p99_s=percentile([run.response_s(i) for i in refusals], 99),
        run=run,
        **kwargs,
    )


def load_config(server: Server, *, protocol: str = "http", **kwargs: Any) -> LoadConfig:
    """A load run against ``server``'s fault-injecting model.

    ``protocol``: ``http`` (OpenAI's embeddings) or ``grpc`` (KServe's ModelInfer; the
    server must serve ``--grpc-port``).
    """
    kwargs.setdefault("model", "faulty")
    if protocol == "grpc":
        assert server.grpc_url is not None, "the server does not serve gRPC"
        return LoadConfig(url=server.grpc_url, api="kserve", **kwargs)
    return LoadConfig(url=server.url, **kwargs)


# -- 1. overload ---------------------------------------------------------------------------


def overload(
    *,
    duration_s: float = 20.0,
    factor: float = 5.0,
    warmup_s: float = 3.0,
    deadline_s: float = 0.25,
    ok_margin_s: float = 0.002,
    protocol: str = "http",
    server_args: Sequence[str] = (),
) -> Figures:
    """Open-loop Poisson load at ``factor`` times the model's capacity.

    A warm-up run at the same rate first (its memory is the baseline), then the measured
    run, over ``protocol`` (``http``, or ``grpc``: KServe's ModelInfer, whose status codes
    the generator reads as the HTTP statuses of the same outcomes), the server started with
    ``server_args`` besides the scenario's own flags. ``extra``:

    * ``late_ok``: successes the server answered more than ``ok_margin_s`` past their
      deadline by its own account (``Server-Timing``: from the request's first byte to its
      answer; the deadline counts from there too);
    * ``late_ok_client``: successes more than 10 ms past their deadline by the client's
      stopwatch from the write (on a starved core the client itself is late to read);
    * ``max_response_s``: the slowest answer of any kind, from the write;
    * ``refusal_p99_server_s``: the p99 of a refusal by the server's account;
    * ``model_capacity``: what the model itself could serve on this machine during the
      run, by the server's own records: items computed per second of forward time (a
      sleeping model overshoots its sleeps when the CPUs are contended), at most nominal;
    * ``model_busy``: the model's forward time over the schedule's length;
    * ``server_cpu``: the share of one core the server used during the run;
    * ``statuses``.
    """
    env = {"BATCHSERVE_FAULT_COST": OVERLOAD_COST}
    args = ["--model", FAULTY, "--max-batch-size", str(OVERLOAD_BATCH), "--max-wait", "2ms"]
    if protocol == "grpc":
        args += ["--grpc-port", "0"]
    args += server_args
    rate = factor * OVERLOAD_CAPACITY
    with serve(args, env) as server:
        warm = load_config(
            server,
            protocol=protocol,
            rate=rate,
            duration_s=warmup_s,
            timeout_s=deadline_s,
            arrivals="poisson",
            seed=1,
            texts=unique_texts(int(rate * warmup_s) + 1, "warm"),
        )
        run_load(warm)
        rss_before = server.rss_bytes()
        config = load_config(
            server,
            protocol=protocol,
            rate=rate,
            duration_s=duration_s,
            timeout_s=deadline_s,
            arrivals="poisson",
            seed=2,
            texts=unique_texts(int(rate * duration_s * 1.2) + 1),
        )
        before = server.scrape()
        cpu0, t0 = server.cpu_s(), time.monotonic()
        run = run_load(config)
        wall = time.monotonic() - t0
        server_cpu = (server.cpu_s() - cpu0) / wall
        after = server.scrape()
        rss_after = server.rss_bytes()
        counts = server.settled_counts()
        healthy = server.healthy()
    ok = run.indices(200)
    refusals = [i for i in range(run.n) if run.status[i] in (429, 503)]

    def delta(name: str) -> float:
        return after.value(name) - before.value(name)

    forward_s = delta("batchserve_forward_seconds_sum")
    items = delta("batchserve_batch_size_sum")
    return _figures(
        "overload" if protocol == "http" else f"overload over {protocol}",
        run,
        rss_before=rss_before,
        rss_after=rss_after,
        capacity=OVERLOAD_CAPACITY,
        counts=counts,
        extra={
            "deadline_s": deadline_s,
            "late_ok": sum(1 for i in ok if not run.server_s(i) <= deadline_s + ok_margin_s),
            "late_ok_client": sum(1 for i in ok if run.response_s(i) > deadline_s + 0.010),
            "max_response_s": max(
                (run.response_s(i) for i in range(run.n) if run.status[i]), default=math.nan
            ),
            "refusal_p99_server_s": percentile([run.server_s(i) for i in refusals], 99),
            "model_capacity": min(OVERLOAD_CAPACITY, items / forward_s) if forward_s else 0.0,
            "model_busy": forward_s / duration_s,
            "server_cpu": server_cpu,
            "statuses": run.statuses(),
            "healthy_after": healthy,
        },
    )


# -- 2 and 3. a model that fails -----------------------------------------------------------


def read_record(path: pathlib.Path) -> list[list[str]]:
    """The passes a recording model was handed, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def failing_model(
    workdir: pathlib.Path,
    *,
    fault_env: dict[str, str],
    duration_s: float = 4.0,
    rate: float = 400.0,
    texts: Sequence[str] | None = None,
    scenario: str = "faults",
) -> Figures:
    """Steady load on a model that fails as ``fault_env`` says; everything it saw recorded.

    Batches collect for up to 10 ms, so failing inputs share their passes with good ones.
    ``extra``: ``record`` (every pass the model was handed), ``batches`` (passes the
    batcher dispatched), ``bisect_calls``, ``failed_items`` (from /metrics).
    """
    record = workdir / f"{scenario}-record.jsonl"
    env = {
        "BATCHSERVE_FAULT_COST": STEADY_COST,
        "BATCHSERVE_FAULT_RECORD": str(record),
        **fault_env,
    }
    args = ["--model", FAULTY, "--max-batch-size", str(STEADY_BATCH), "--max-wait", "10ms"]
    n = int(rate * duration_s) + 1
    with serve(args, env) as server:
        rss_before = server.rss_bytes()
        config = load_config(
            server,
            rate=rate,
            duration_s=duration_s,
            timeout_s=2.0,
            texts=tuple(texts) if texts is not None else unique_texts(n),
        )
        run = run_load(config)
        rss_after = server.rss_bytes()
        counts = server.settled_counts()
        scrape = server.scrape()
        healthy = server.healthy()
    return _figures(
        scenario,
        run,
        rss_before=rss_before,
        rss_after=rss_after,
        capacity=STEADY_CAPACITY,
        counts=counts,
        extra={
            "record": read_record(record),
            "batches": int(scrape.value("batchserve_batch_size_count")),
            "bisect_calls": int(scrape.value("batchserve_bisect_calls_total")),
            "failed_items": int(scrape.value("batchserve_items_total", outcome="failed")),
            "healthy_after": healthy,
        },
    )


# -- 4. a stuck model ----------------------------------------------------------------------


def stuck_model(
    workdir: pathlib.Path,
    *,
    stall_at_s: float = 1.0,
    stall_s: float = 1.5,
    after_s: float = 1.5,
    rate: float = 100.0,
    deadline_s: float = 0.3,
) -> Figures:
    """Steady load; the model's passes stall at ``stall_at_s`` for ``stall_s``, then recover.

    ``extra``: ``stall`` (start, end offsets), ``deadline_s`` and ``statuses``.
    """
    stall = workdir / "stall"
    env = {"BATCHSERVE_FAULT_COST": STEADY_COST, "BATCHSERVE_FAULT_STALL_FILE": str(stall)}
    args = ["--model", FAULTY, "--max-batch-size", str(STEADY_BATCH), "--max-wait", "2ms"]
    duration_s = stall_at_s + stall_s + after_s
    with serve(args, env) as server:
        rss_before = server.rss_bytes()
        config = load_config(
            server,
            rate=rate,
            duration_s=duration_s,
            timeout_s=deadline_s,
            texts=unique_texts(int(rate * duration_s) + 1),
        )
        run = run_load(
            config,
            events=[(stall_at_s, stall.touch), (stall_at_s + stall_s, stall.unlink)],
        )
        rss_after = server.rss_bytes()
        counts = server.settled_counts()
        healthy = server.healthy()
    return _figures(
        "stuck model",
        run,
        rss_before=rss_before,
        rss_after=rss_after,
        capacity=STEADY_CAPACITY,
        counts=counts,
        extra={
            "stall": (stall_at_s, stall_at_s + stall_s),
            "deadline_s": deadline_s,
            "statuses": run.statuses(),
            "healthy_after": healthy,
        },
    )


# -- 5. clients that leave -----------------------------------------------------------------


def http_request(
    text: str, *, model: str = "faulty", timeout: str = "60s", path: str = "/v1/embeddings"
) -> bytes:
    """The bytes of one embeddings request for ``text``."""
    body = json.dumps({"input": text, "model": model}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Request-Timeout: {timeout}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _gauge(server: Server, name: str) -> float:
    return server.scrape().value(name)


def _waiting(server: Server) -> float:
    # Items waiting behind the one stuck pass (its one item): queued or prefetched.
    scrape = server.scrape()
    return scrape.value("batchserve_queue_depth") + scrape.value("batchserve_running_items") - 1


def leaving_clients(workdir: pathlib.Path, *, clients: int = 1000, rounds: int = 2) -> Figures:
    """``clients`` requests queued behind a stuck pass, whose clients all disconnect.

    Repeated ``rounds`` times on one server. ``extra``: per round, the queue depth reached,
    the cancelled count, the loop's task count before and after, the leavers' texts the model
    saw (must be none), and the blocker's status once the model recovers.
    """
    stall = workdir / "stall"
    record = workdir / "leavers-record.jsonl"
    env = {
        "BATCHSERVE_FAULT_COST": STEADY_COST,
        "BATCHSERVE_FAULT_STALL_FILE": str(stall),
        "BATCHSERVE_FAULT_RECORD": str(record),
    }
    args = ["--model", FAULTY, "--max-batch-size", str(STEADY_BATCH), "--queue-size", "4096"]
    rounds_out: list[dict[str, Any]] = []
    with serve(args, env) as server:
        # One ordinary request first: the loop, the worker thread and the metrics are warm.
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(http_request("warm-up"))
            read_response(s)
        rss_before = server.rss_bytes()
        tasks_idle = _gauge(server, "batchserve_event_loop_tasks")
        for r in range(rounds):
            stall.touch()
            blocker = socket.create_connection(("127.0.0.1", server.port))
            blocker.sendall(http_request(f"blocker-{r}"))
            if not wait_until(lambda: _gauge(server, "batchserve_running_items") == 1, 10):
                raise RuntimeError("the blocker never reached the model")
            before = server.counts()
            socks = []
            for i in range(clients):
                s = socket.create_connection(("127.0.0.1", server.port))
                s.sendall(http_request(f"leaver-{r}-{i:05d}"))
                socks.append(s)
            # Queued, or prefetched behind the stuck pass (dispatched, its pass not begun).
            filled = wait_until(lambda: _waiting(server) == clients, 30)
            depth = int(_waiting(server))
            tasks_busy = _gauge(server, "batchserve_event_loop_tasks")
            for s in socks:
                s.close()
            emptied = wait_until(lambda: _gauge(server, "batchserve_queue_depth") == 0, 30)
            # The prefetched leavers are skipped, and counted, when the stuck pass ends.
            gone = before["cancelled"] + clients
            wait_until(lambda: server.counts()["cancelled"] >= gone, 10)  # noqa: B023
            after = server.counts()
            stall.unlink()
            blocker.settimeout(10)
            status, _, _ = read_response(blocker)
            blocker.close()
            wait_until(lambda: server.counts().in_flight == 0, 10)
            tasks_after = 0.0
            wait_until(lambda: _gauge(server, "batchserve_event_loop_tasks") <= tasks_idle, 10)
            tasks_after = _gauge(server, "batchserve_event_loop_tasks")
            seen = {t for batch in read_record(record) for t in batch}
            rounds_out.append(
                {
                    "filled": filled,
                    "depth": depth,
                    "emptied": emptied,
                    "cancelled": after["cancelled"] - before["cancelled"],
                    "received": after.received - before.received,
                    "tasks_idle": tasks_idle,
                    "tasks_busy": tasks_busy,
                    "tasks_after": tasks_after,
                    "leavers_seen": sorted(t for t in seen if t.startswith(f"leaver-{r}-")),
                    "blocker_status": status,
                    "rss": server.rss_bytes(),
                }
            )
        counts = server.settled_counts()
        rss_after = server.rss_bytes()
    return Figures(
        scenario="clients that leave",
        duration_s=0.0,
        offered=clients * rounds + rounds + 1,
        ok=rounds + 1,
        refusals=0,
        lost=0,
        ok_p99_s=math.nan,
        refusal_p99_s=math.nan,
        rss_before=rss_before,
        rss_after=rss_after,
        counts=counts,
        extra={"rounds": rounds_out},
    )


# -- 6. graceful shutdown ------------------------------------------------------------------


def shutdown_under_load(
    workdir: pathlib.Path,
    *,
    duration_s: float = 3.0,
    signal_at_s: float = 1.5,
    rate: float = 200.0,
    drain_timeout_s: float = 10.0,
    second_signal_after_s: float | None = None,
    stall: bool = False,
    drain_stall_s: float = 0.0,
) -> Figures:
    """SIGTERM in the middle of steady load (and, if asked, a second one soon after).

    With ``stall`` the model is stuck from the start of the run, so a drain could not end
    on its own. With ``drain_stall_s`` it is stuck from :data:`STALL_LEAD_S` before the
    signal to ``drain_stall_s`` after it, so work is queued when the signal comes and the
    drain takes at least that long. ``extra``: ``exit_status``, ``exit_after_s`` (from the
    first signal), ``stderr``, ``computed`` (texts the model saw), ``signal_offset_s``.
    """
    record = workdir / "shutdown-record.jsonl"
    stall_file = workdir / "stall"
    env = {
        "BATCHSERVE_FAULT_COST": STEADY_COST,
        "BATCHSERVE_FAULT_RECORD": str(record),
        "BATCHSERVE_FAULT_STALL_FILE": str(stall_file),
    }
    args = [
        "--model",
        FAULTY,
        "--max-batch-size",
        str(STEADY_BATCH),
        "--drain-timeout",
        f"{drain_timeout_s}s",
    ]
    marks: dict[str, float] = {}
    with serve(args, env) as server:
        rss_before = server.rss_bytes()

        def first() -> None:
            marks["rss"] = server.rss_bytes()
            marks["signal"] = time.monotonic()
            server.signal(signal.SIGTERM)

        def unstall() -> None:
            if stall_file.exists():
                stall_file.unlink()

        def second() -> None:
            marks["second"] = time.monotonic()
            server.signal(signal.SIGTERM)

        events: list[tuple[float, Callable[[], None]]] = [(signal_at_s, first)]
        if second_signal_after_s is not None:
            events.append((signal_at_s + second_signal_after_s, second))
        if drain_stall_s:
            # Stuck from a little before the signal, so that work is queued when it comes.
            events.append((signal_at_s - STALL_LEAD_S, stall_file.touch))
            events.append((signal_at_s + drain_stall_s, unstall))
        if stall:
            stall_file.touch()
        config = load_config(
            server,
            rate=rate,
            duration_s=duration_s,
            timeout_s=drain_timeout_s * 2,
            client_timeout_s=drain_timeout_s * 2 + 5,
            texts=unique_texts(int(rate * duration_s) + 1, "sd"),
        )
        run = run_load(config, events=events)
        status = server.wait_exit(drain_timeout_s + 10)
        wait_until(lambda: server.exited_at is not None, 1.0)
        exited = server.exited_at if server.exited_at is not None else math.inf
        stderr = server.stderr_text()
    if stall_file.exists():
        stall_file.unlink()
    computed = [t for batch in read_record(record) for t in batch]
    figures = _figures(
        "shutdown" if second_signal_after_s is None else "second SIGTERM",
        run,
        rss_before=rss_before,
        rss_after=int(marks.get("rss", 0)),
        extra={
            "exit_status": status,
            "exit_after_s": exited - marks["signal"] if "signal" in marks else math.nan,
            "stderr": stderr,
            "computed": computed,
            "signal_offset_s": signal_at_s,
            "statuses": run.statuses(),
        },
    )
    # Lost: sent before the signal and never answered. After it, a connection refused or
    # reset at the closed door is the answer the scenario expects.
    offsets = run.result.offsets
    figures.lost = sum(
        1 for i in range(run.n) if run.status[i] == 0 and offsets[i] < signal_at_s - 0.05
    )
    return figures


# -- 8. soak -------------------------------------------------------------------------------


def soak(*, duration_s: float = 300.0, load: float = 0.7, warmup_s: float = 10.0) -> Figures:
    """Poisson load at ``load`` times capacity for ``duration_s``, after a warm-up.

    ``extra``: ``p99_first_s`` and ``p99_last_s``, the successes' p99 latency over the first
    and the last minute (or sixth of the run, if shorter).
    """
    env = {"BATCHSERVE_FAULT_COST": OVERLOAD_COST}
    args = ["--model", FAULTY, "--max-batch-size", str(OVERLOAD_BATCH), "--max-wait", "2ms"]
    rate = load * OVERLOAD_CAPACITY
    with serve(args, env) as server:
        run_load(
            load_config(
                server,
                rate=rate,
                duration_s=warmup_s,
                timeout_s=0.25,
                arrivals="poisson",
                seed=3,
                texts=unique_texts(int(rate * warmup_s) + 1, "warm"),
            )
        )
        rss_before = server.rss_bytes()
        config = load_config(
            server,
            rate=rate,
            duration_s=duration_s,
            timeout_s=0.25,
            arrivals="poisson",
            seed=4,
            texts=unique_texts(int(rate * duration_s * 1.2) + 1),
        )
        run = run_load(config)
        rss_after = server.rss_bytes()
        counts = server.settled_counts()
    window = min(60.0, duration_s / 6)
    offsets = run.result.offsets
    ok = run.indices(200)
    first = [run.latency_s(i) for i in ok if offsets[i] < window]
    last = [run.latency_s(i) for i in ok if offsets[i] >= duration_s - window]
    return _figures(
        "soak",
        run,
        rss_before=rss_before,
        rss_after=rss_after,
        capacity=OVERLOAD_CAPACITY,
        counts=counts,
        extra={"p99_first_s": percentile(first, 99), "p99_last_s": percentile(last, 99)},
    )
