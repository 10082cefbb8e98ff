"""The seed scenario over HTTP versus in-process, side by side in one run.

The Go seed's experiment: a synthetic model of 8 ms per call + 0.25 ms per item, 600
requests/s offered open loop, a 250 ms deadline, a queue of 64, batches of at most 32 closed
after 2 ms. It runs twice per round, interleaved:

* **in-process**: ``batchserve.loadgen.inprocess.run_open_loop`` on a Batcher in this process (what
  ``batchserve demo`` prints);
* **HTTP**: a real ``batchserve serve`` in a subprocess with the same settings, driven by a
  minimal open-loop HTTP/1.1 sender in this process (``POST /v1/embeddings``, one text per
  request, deadline in ``X-Request-Timeout``). Send times come from the schedule, never from
  answers; latency runs from each request's scheduled send time, so a late sender or a slow
  server cannot hide a queue.

It prints the share of requests HTTP serves and the ratio of its p99 to the in-process
p99. Each answer's ``Server-Timing`` gives the server's own
share of that p99 (from its first byte read to its answer), apart from the sender's lag and
the kernel's. Prints figures and ratios; not a test. The machine is shared and has 2
cores (client, server and model share them): figures are noisy, compare within one run.

Run: ``.venv/bin/python bench/http_seed.py [--rounds 3] [--duration 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from _harness import batchserve

from batchserve.config import BatchConfig
from batchserve.loadgen.inprocess import run_open_loop
from batchserve.models.synthetic import SyntheticModel
from batchserve.workload.arrivals import arrival_times
from batchserve.workload.summary import LoadSummary, summarize


@dataclass
class HttpRun:
    sent: int = 0
    latencies_s: list[float] = field(default_factory=list)
    by_status: dict[str, int] = field(default_factory=dict)
    max_send_lag_s: float = 0.0
    late: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    #: Each 200's time by the server's own clock (``Server-Timing``: from its first byte read
    #: to its answer): what the server spent, without the sender's lag or the kernel's.
    server_s: list[float] = field(default_factory=list)


class Connection:
    """One keep-alive HTTP/1.1 connection that sends a request and reads one response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def exchange(self, request: bytes) -> tuple[int, int, float]:
        """Send; return the status, the X-Batch-Size (0 if absent) and the server's own
        time in seconds (``Server-Timing``; -1 if absent)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        match = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
        if match:
            await self.reader.readexactly(int(match.group(1)))
        batch = re.search(rb"(?i)\r\nx-batch-size:\s*(\d+)", head)
        timing = re.search(rb"(?i)\r\nserver-timing:\s*total;dur=([\d.]+)", head)
        return (
            status,
            int(batch.group(1)) if batch else 0,
            float(timing.group(1)) / 1e3 if timing else -1.0,
        )


async def http_open_loop(
    host: str, port: int, schedule: list[float], timeout_s: float, model: str
) -> HttpRun:
    out = HttpRun()
    idle: list[Connection] = []
    # Warm a pool of connections first, as a client library would keep.
    for _ in range(32):
        idle.append(Connection(*await asyncio.open_connection(host, port)))

    async def one(i: int, at: float) -> None:
        body = json.dumps({"input": f"request {i}", "model": model}).encode()
        request = (
            f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"X-Request-Timeout: {timeout_s}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        conn = idle.pop() if idle else Connection(*await asyncio.open_connection(host, port))
        try:
            status, batch, server_s = await conn.exchange(request)
        except (OSError, asyncio.IncompleteReadError):
            out.by_status["conn_error"] = out.by_status.get("conn_error", 0) + 1
            return
        idle.append(conn)
        done = time.monotonic()
        key = str(status)
        out.by_status[key] = out.by_status.get(key, 0) + 1
        if batch:
            out.batch_sizes.append(batch)
        if status == 200 and done - at <= timeout_s:
            out.latencies_s.append(done - at)
            if server_s >= 0:
                out.server_s.append(server_s)
        elif status == 200:
            out.late += 1

    tasks = []
    start = time.monotonic() + 0.05
    for i, offset in enumerate(schedule):
        at = start + offset
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        out.max_send_lag_s = max(out.max_send_lag_s, time.monotonic() - at)
        tasks.append(asyncio.ensure_future(one(i, at)))
    await asyncio.gather(*tasks)
    out.sent = len(schedule)
    for conn in idle:
        conn.writer.close()
    return out


def http_summary(run: HttpRun, duration_s: float) -> LoadSummary:
    """The HTTP run in the demo's terms: the same percentile rule, the same columns."""
    rejected = {k: v for k, v in run.by_status.items() if k in ("429", "503")}
    timed_out = run.by_status.get("504", 0) + run.late
    errors = run.sent - len(run.latencies_s) - sum(rejected.values()) - timed_out
    return summarize(
        name="HTTP",
        latencies_s=run.latencies_s,
        sent=run.sent,
        duration_s=duration_s,
        offered_per_s=run.sent / duration_s,
        rejected_by_reason=rejected,
        timed_out=timed_out,
        errors=errors,
        # Each request saw its pass's size: the item-weighted mean, as the demo's avg_batch.
        items=len(run.batch_sizes),
        batches=int(sum(1 / b for b in run.batch_sizes)) or 1,
    )


def server_flags(args: argparse.Namespace) -> list[str]:
    spec = f"synthetic:fixed={args.fixed * 1e3:g}ms,per_item={args.per_item * 1e3:g}ms,dim=8"
    return [
        "--model", f"seed={spec}",
        "--max-batch-size", str(args.max_batch_size),
        "--max-wait", f"{args.max_wait * 1e3:g}ms",
        "--queue-size", str(args.queue_size),
        "--timeout", f"{args.timeout * 1e3:g}ms",
    ]  # fmt: skip


def arun(coro: Any) -> Any:
    """Run on uvloop when installed: the sender's own CPU competes with the server's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=0.25)
    parser.add_argument("--fixed", type=float, default=0.008)
    parser.add_argument("--per-item", type=float, default=0.00025)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait", type=float, default=0.002)
    parser.add_argument("--queue-size", type=int, default=64)
    args = parser.parse_args()
    config = BatchConfig(
        max_batch_size=args.max_batch_size, max_wait_s=args.max_wait, queue_size=args.queue_size
    )
    schedule = arrival_times(rate=args.rate, duration_s=args.duration)
    print(
        f"seed scenario: model {args.fixed * 1e3:g} ms + {args.per_item * 1e3:g} ms/item, "
        f"{args.rate:g} req/s open loop for {args.duration:g} s, deadline "
        f"{args.timeout * 1e3:g} ms, batch<={args.max_batch_size}, wait "
        f"{args.max_wait * 1e3:g} ms, queue {args.queue_size}; {args.rounds} rounds\n"
    )
    ratios = []
    server_ratios: list[float] = []
    served = []
    with batchserve(server_flags(args)) as server:
        host, port = server.host, server.port
        # One warm-up run so the server's cost model has measured the model.
        arun(http_open_loop(host, port, schedule[: len(schedule) // 3], args.timeout, "seed"))
        for r in range(args.rounds):
            local = asyncio.run(  # as `batchserve demo` runs it
                run_open_loop(
                    name="in-process",
                    model=SyntheticModel(args.fixed, args.per_item),
                    config=config,
                    schedule=schedule,
                    timeout_s=args.timeout,
                    duration_s=args.duration,
                )
            )
            run = arun(http_open_loop(host, port, schedule, args.timeout, "seed"))
            remote = http_summary(run, args.duration)
            print(f"round {r + 1}:")
            for row in (local, remote):
                print(f"  {row.format_row()}  served {row.ok / row.sent * 100:6.2f}%")
            print(
                f"  HTTP statuses {run.by_status}, sender lag max {run.max_send_lag_s * 1e3:.1f} ms"
            )
            ratio = remote.p99_ms / local.p99_ms if local.p99_ms else float("inf")
            ratios.append(ratio)
            served.append(remote.ok / remote.sent)
            print(f"  HTTP p99 / in-process p99 = {ratio:.2f}x")
            if run.server_s:
                own = sorted(run.server_s)[
                    min(len(run.server_s) - 1, int(0.99 * len(run.server_s)))
                ]
                server_ratios.append(own * 1e3 / local.p99_ms if local.p99_ms else float("inf"))
                print(
                    f"  by the server's own clock (Server-Timing): p99 {own * 1e3:.1f} ms = "
                    f"{server_ratios[-1]:.2f}x in-process; the rest of the HTTP p99 is the "
                    "sender's lag, the kernel and the client"
                )
    med_ratio = statistics.median(ratios)
    min_served = min(served)
    print(f"\nmedian p99 ratio {med_ratio:.2f}x; lowest HTTP served {min_served * 100:.2f}%")
    if server_ratios:
        print(
            f"median p99 by the server's own clock / in-process p99: "
            f"{statistics.median(server_ratios):.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
