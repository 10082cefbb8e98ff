"""What one request costs the front end: closed loop on the null model, side by side.

Every contender answers OpenAI ``POST /v1/embeddings`` (``{"input": "hello world"}``, 8
floats back) from a model that costs nothing, max batch 64, max wait 2 ms, in its own
process on a free port of 127.0.0.1, and ``wrk`` (Debian's ``wrk``: one thread, 64
keep-alive connections) drives each in turn for ``--seconds``, ``--rounds`` times
interleaved; the table gives each one's median requests/s and its ratio to the yardstick.

* ``yardstick``: ``bench/apps/yardstick.py``, the simplest dynamic batcher on the same stack
  (uvicorn + httptools + uvloop, a bounded queue, one thread hop per batch);
* ``batchserve``: ``batchserve serve`` (inference requests carried by its connection
  protocol, :mod:`batchserve.server.transport.httptools`);
* ``batchserve-asgi``: the same application under plain uvicorn, every request through ASGI
  (what the connection protocol saves);
* ``batchserve-granian``: the same application under Granian's ASGI server (a Rust HTTP
  layer), when ``granian`` is installed;
* ``batchserve-rsgi``: the same application under Granian's lighter RSGI interface
  (``bench/apps/rsgi_app.py``: an exchange per inference request, as the connection protocol).

``--via inprocess`` measures the same cost without sockets: the event loop's CPU per
request, ``yardstick`` beside ``batchserve``. Each one's connection protocol is driven in a
fresh process by fake transports, 64 of them, each sending the same request again as soon
as its answer is written; the null model answers through the batcher's worker thread as in
the server. What is left is the Python a request costs between the parser and the
``write``: no syscalls, no client, no kernel, so a change to the request path shows here
with far less noise than under ``wrk`` (``--requests`` per round). The yardstick is
uvicorn's httptools protocol running ``bench/apps/yardstick.py``'s ASGI app. With
``--refuse``, a refusal instead: batchserve's model is stuck in a pass (one queue slot,
taken), so every request is refused 429 ``queue_full`` from its head; the yardstick's queue
bound is 0, so it refuses every request 429 after parsing its body.

``--otel`` measures what tracing costs instead: ``batchserve`` without ``--otel``, then with
it, its spans made and dropped (``OTEL_TRACES_EXPORTER=none``) and written by the console
exporter to /dev/null, a stand-in for a collector (the spans' making, not a network), the
ratios to the first. Without ``--otel`` nothing of OpenTelemetry is loaded
(``tests/server/ops/test_tracing.py`` checks it), so the first is the plain server.

``--profile`` also records a py-spy flame graph of ``batchserve`` during one extra run into
``bench/out/request_path-<time>.svg`` (``pip install py-spy``; with ``--via inprocess``,
its collapsed stacks into ``bench/out/``). The CPU a contender uses is
measured from ``/proc`` over its runs and printed as CPU seconds per 1,000 requests.

Run: ``python bench/server/request_path.py [--rounds 5] [--seconds 4] [--otel] [--profile]
[--json]``, or ``python bench/server/request_path.py --via inprocess [--refuse]
[--requests 40000]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from batchserve_testing.bench import (
    APPS,
    CONTENDERS,
    OTEL_CONTENDERS,
    OUT,
    cpu_s,
    running,
    wrk,
)

BIN = pathlib.Path(sys.executable).parent

# -- --via inprocess: the protocols driven without sockets ------------------------------------

BODY = b'{"input": "hello world", "model": "m"}'
REQUEST = (
    b"POST /v1/embeddings HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)
CONNECTIONS = 64
NULL = "synthetic:fixed=0ms,per_item=0ms,dim=8"
STUCK = "synthetic:fixed=1000s,per_item=0ms,dim=8"


class FakeTransport:
    """What the protocols write to: keeps the last answer and says which one answered."""

    def __init__(self, protocol: Any, answered: list[Any]) -> None:
        self.protocol = protocol
        self.answered = answered
        self.last = b""
        self.closing = False

    def write(self, data: bytes) -> None:
        if not self.last or data.startswith(b"HTTP/"):
            self.answered.append(self.protocol)  # once per answer (uvicorn writes twice)
        self.last = data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name in ("sockname", "peername") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _protocol_class(which: str, refuse: bool) -> tuple[Any, Any]:
    import uvicorn

    if which == "yardstick":
        import importlib.util

        spec = importlib.util.spec_from_file_location("yardstick", APPS / "yardstick.py")
        assert spec is not None
        assert spec.loader is not None
        yardstick = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(yardstick)
        if refuse:
            yardstick.__dict__["QUEUE"] = 0  # refuse every request after parsing it

        config = uvicorn.Config(
            yardstick.app, http="httptools", lifespan="off", access_log=False, log_level="warning"
        )
        config.load()
        return config, config.http_protocol_class
    from dataclasses import replace

    from batchserve.config import BatchConfig, CostEstimate
    from batchserve.server import App, ModelSettings, ServerSettings
    from batchserve.server.transport.httptools import connection_protocol

    if refuse:
        # Without prefetch, so that the queue's one slot stays taken behind the stuck pass
        # (with it, the queued request would be dispatched behind the pass and free it).
        batch = BatchConfig(max_batch_size=1, max_wait_s=0.0, queue_size=1, prefetch=False)
        cost = CostEstimate(fixed_s=0.0, per_item_s=0.0)
        batch = replace(batch, initial_cost=cost)
        # A deadline far enough for the stuck pass: the refusals are queue_full, the
        # common one under overload (none of them needs a prediction).
        model = ModelSettings(name="m", spec=STUCK, batch=batch, timeout_s=1e6)
    else:
        batch = BatchConfig(max_batch_size=64, max_wait_s=0.002, queue_size=1024)
        model = ModelSettings(name="m", spec=NULL, batch=batch)
    app = App(ServerSettings(models=(model,)))
    await app.wait_ready()
    config = uvicorn.Config(
        app,
        lifespan="off",
        access_log=False,
        log_level="warning",
        http=connection_protocol(app, read_timeout_s=30),
    )
    config.load()
    return config, config.http_protocol_class


async def _drive(which: str, requests: int, refuse: bool) -> None:
    from uvicorn.server import ServerState

    config, protocol_class = await _protocol_class(which, refuse)
    loop = asyncio.get_running_loop()
    state = ServerState()
    answered: list[Any] = []
    protocols = []
    for _ in range(CONNECTIONS):
        p = protocol_class(config=config, server_state=state, app_state={}, _loop=loop)
        p.connection_made(FakeTransport(p, answered))
        protocols.append(p)

    async def run(n: int) -> int:
        done, ready = 0, list(protocols)
        while done < n:
            for p in ready:
                p.data_received(REQUEST)
            while not answered:  # noqa: ASYNC110 - one loop turn at a time is the point
                await asyncio.sleep(0)
            ready = answered[:]
            answered.clear()
            done += len(ready)
        while len(answered) < len(protocols) - len(ready):  # noqa: ASYNC110 - the rest finish
            await asyncio.sleep(0)
        answered.clear()
        return done

    if refuse and which == "batchserve":
        # One request into the stuck pass and one into the queue's only slot.
        for p in protocols[:2]:
            p.data_received(REQUEST)
        await asyncio.sleep(0.05)
        protocols = protocols[2:]
    await run(CONNECTIONS * 10)  # warm up
    cpu0, wall0 = time.process_time(), time.perf_counter()
    done = await run(requests)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    last = protocols[0].transport.last
    if refuse:
        assert b"HTTP/1.1 429" in last or b"queue full" in last, last[:200]
    else:
        assert b'"embedding"' in last or b"HTTP/1.1 200" in last, last[:200]
    print(f"{1e6 * cpu / done:.2f} {1e6 * wall / done:.2f}", flush=True)


def _child(which: str, requests: int, refuse: bool) -> None:
    import uvloop

    uvloop.run(_drive(which, requests, refuse))
    os._exit(0)  # the model's worker threads are daemons


def _run(which: str, requests: int, profile: bool, refuse: bool) -> float:
    cmd = [sys.executable, __file__, "--via", "inprocess", "--child", which]
    cmd += ["--requests", str(requests)]
    cmd += ["--refuse"] if refuse else []
    if profile:
        OUT.mkdir(exist_ok=True)
        path = OUT / f"request_path-inprocess-{which}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
        spy = pathlib.Path(sys.executable).parent / "py-spy"
        cmd = [str(spy), "record", "-r", "1000", "-f", "raw", "-o", str(path), "--", *cmd]
        print(f"profile: {path}")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    figures = [line for line in out.splitlines() if line[:1].isdigit()]
    return float(figures[-1].split()[0])


def in_process(args: argparse.Namespace) -> None:
    """``--via inprocess``: each contender's CPU per request (or refusal), no sockets."""
    if args.child:
        _child(args.child, args.requests, args.refuse)
        return
    if args.profile:
        _run("batchserve", args.requests, profile=True, refuse=args.refuse)
        return
    names = ("yardstick", "batchserve")
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            cpu[n].append(_run(n, args.requests, profile=False, refuse=args.refuse))
            print(f"round {r + 1} {n:<11} {cpu[n][-1]:7.1f} us/request", file=sys.stderr)
    base = statistics.median(cpu["yardstick"])
    what = "refusal" if args.refuse else "request"
    if args.json:
        for n in names:
            med = statistics.median(cpu[n])
            row = {"server": n, f"cpu_us_per_{what}": round(med, 2), "ratio": round(med / base, 3)}
            print(json.dumps(row | {"rounds": args.rounds, "requests": args.requests}))
        return
    print(f"\nCPU per {what}, in process, {args.requests} x {args.rounds} rounds (median, range)")
    for n in names:
        med = statistics.median(cpu[n])
        print(
            f"{n:<11} {med:7.1f} us  ({min(cpu[n]):.1f}-{max(cpu[n]):.1f})  "
            f"x{med / base:.2f} the yardstick"
        )


# -- --via http: wrk over real sockets ----------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument(
        "--servers",
        help="contenders, the first the yardstick of the ratios (default: "
        f"{','.join(CONTENDERS)}; with --otel, {','.join(OTEL_CONTENDERS)})",
    )
    parser.add_argument(
        "--otel", action="store_true", help="what --otel costs: batchserve without and with it"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy flame graph of batchserve")
    parser.add_argument("--json", action="store_true", help="one JSON object per contender")
    parser.add_argument(
        "--via",
        choices=["http", "inprocess"],
        default="http",
        help="http: wrk over sockets; inprocess: the protocols driven without sockets",
    )
    parser.add_argument("--requests", type=int, default=40000, help="per round, --via inprocess")
    parser.add_argument("--refuse", action="store_true", help="--via inprocess: a refusal (429)")
    parser.add_argument("--child", choices=["batchserve", "yardstick"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.via == "inprocess":
        if args.otel or args.servers:
            parser.error("--otel and --servers apply to --via http")
        in_process(args)
        return
    if args.refuse:
        parser.error("--refuse applies to --via inprocess")
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed: scripts/install-tools wrk")
    servers = args.servers or ",".join(OTEL_CONTENDERS if args.otel else CONTENDERS)
    names = [n for n in servers.split(",") if n]
    width = max(20, *map(len, names))
    for granian in ("batchserve-granian", "batchserve-rsgi"):
        if granian in names and not (BIN / "granian").exists():
            print(f"granian is not installed (pip install granian): skipping {granian}")
            names.remove(granian)
    rates: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    bad: dict[str, int] = dict.fromkeys(names, 0)
    for r in range(args.rounds):
        for name in names:
            with running(name) as (port, pid):
                c0 = cpu_s(pid)
                rate, n_bad = wrk(port, args.seconds)
                used = cpu_s(pid) - c0
            rates[name].append(rate)
            cpu[name].append(used / max(1.0, rate * args.seconds) * 1000)
            bad[name] += n_bad
            print(f"round {r + 1} {name:{width}s} {rate:9.0f} req/s", file=sys.stderr, flush=True)
    base = statistics.median(rates[names[0]])
    if args.json:
        for name in names:
            med = statistics.median(rates[name])
            row = {
                "server": name,
                "requests_per_s": round(med),
                "ratio": round(med / base, 3),
                "cpu_ms_per_1k": round(statistics.median(cpu[name]) * 1000, 1),
                "non_2xx": bad[name],
                "rounds": args.rounds,
                "seconds": args.seconds,
            }
            print(json.dumps(row))
        return
    print(f"\nclosed loop, wrk -t1 -c64, {args.seconds:g} s x {args.rounds} rounds, null model")
    print(
        f"{'server':{width}s} {'req/s (median)':>15s} {'ratio':>7s} "
        f"{'CPU s/1k req':>13s} {'non-2xx':>8s}"
    )
    for name in names:
        med = statistics.median(rates[name])
        print(
            f"{name:{width}s} {med:15.0f} {med / base:7.2f} "
            f"{statistics.median(cpu[name]):13.3f} {bad[name]:8d}"
        )
    if args.profile:
        OUT.mkdir(exist_ok=True)
        svg = OUT / f"request_path-{time.strftime('%Y%m%d-%H%M%S')}.svg"
        with running("batchserve") as (port, pid):
            spy = subprocess.Popen(
                [
                    *(str(BIN / "py-spy"), "record", "-p", str(pid)),
                    *("-d", str(args.seconds + 1), "-r", "500", "-o", str(svg)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)
            wrk(port, args.seconds)
            spy.wait()
        print(f"\nflame graph: {svg}")


if __name__ == "__main__":
    main()
