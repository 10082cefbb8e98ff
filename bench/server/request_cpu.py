"""The event loop's CPU per inference request, without sockets: batchserve vs the yardstick.

Each contender's connection protocol is driven in-process by fake transports, 64 of them,
each sending the closed-loop benchmark's request (OpenAI ``POST /v1/embeddings``,
``{"input": "hello world", "model": "m"}``) again as soon as its answer is written; the
null model (``synthetic``, no cost, 8 floats) answers through the batcher's worker thread as
in the server. What is left is the Python that a request costs between the parser and the
``write``: no syscalls, no client, no kernel, so a change to the request path shows here
with far less noise than under ``wrk`` (``bench/server/request_path.py``, which adds the sockets).

* ``batchserve``: the server's own protocol (:mod:`batchserve.server.transport.httptools`) on
  its app, max batch 64, max wait 2 ms, queue 1,024;
* ``yardstick``: uvicorn's httptools protocol running ``bench/apps/yardstick.py``'s ASGI app.

``--refuse`` measures a refusal instead: batchserve's model is stuck in a pass (one queue
slot, taken), so every request is refused 429 ``queue_full`` from its head; the
yardstick's queue bound is 0, so it refuses every request 429 after parsing its body.

Each round runs both, one after the other, in fresh processes; the table gives each one's
median process CPU per request over the rounds and the ratio. Optionally profile one
contender: ``--profile batchserve`` writes py-spy's collapsed stacks to ``bench/out/``.

Run: ``python bench/server/request_cpu.py [--rounds 5] [--requests 40000]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

from batchserve_testing.bench import APPS, OUT

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
    cmd = [sys.executable, __file__, "--child", which, "--requests", str(requests)]
    cmd += ["--refuse"] if refuse else []
    if profile:
        OUT.mkdir(exist_ok=True)
        path = OUT / f"request_cpu-{which}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
        spy = pathlib.Path(sys.executable).parent / "py-spy"
        cmd = [str(spy), "record", "-r", "1000", "-f", "raw", "-o", str(path), "--", *cmd]
        print(f"profile: {path}")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    figures = [line for line in out.splitlines() if line[:1].isdigit()]
    return float(figures[-1].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=40000)
    parser.add_argument("--profile", choices=["batchserve", "yardstick"])
    parser.add_argument("--refuse", action="store_true", help="measure a refusal (429)")
    parser.add_argument("--child", choices=["batchserve", "yardstick"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.requests, args.refuse)
        return
    if args.profile:
        _run(args.profile, args.requests, profile=True, refuse=args.refuse)
        return
    names = ("yardstick", "batchserve")
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            cpu[n].append(_run(n, args.requests, profile=False, refuse=args.refuse))
            print(f"round {r + 1} {n:<11} {cpu[n][-1]:7.1f} us/request", flush=True)
    base = statistics.median(cpu["yardstick"])
    what = "refusal" if args.refuse else "request"
    print(f"\nCPU per {what}, {args.requests} x {args.rounds} rounds (median, range)")
    for n in names:
        med = statistics.median(cpu[n])
        print(
            f"{n:<11} {med:7.1f} us  ({min(cpu[n]):.1f}-{max(cpu[n]):.1f})  "
            f"x{med / base:.2f} the yardstick"
        )


if __name__ == "__main__":
    main()
