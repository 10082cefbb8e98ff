"""How fast can `batchserve load` send? The generator against a server that answers at once.

The server is a raw asyncio (uvloop + httptools) HTTP/1.1 server in its own process that
answers every request with a fixed 200 and batch headers, so nearly all the work measured is
the generator's and the kernel's. For each (processes, rate) the generator runs an open-loop
schedule and we print what it achieved, how late it wrote, and the CPU both sides used.

A rate is *sustained* when the generator wrote >= 99% of the offered rate and >= 99% of the
requests were answered 200; it is *clean* when, also, every request was written within the
report's thresholds of its scheduled time (lag p99 <= 1 ms, max <= 10 ms). "own max" is the
part of the lag that is the generator's own timing (the rest is waiting for a connection).
Both sides share this machine's cores (and with anything else running), so the figures are
noisy: the load average is printed.

    python bench/tools/loadgen_capacity.py                      # default ladder
    python bench/tools/loadgen_capacity.py --rates 5000,10000 --processes 1,2 --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass

from batchserve.loadgen import LoadConfig, LoadReport, run_load
from batchserve.loadgen.runner import loop_factory

RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-queue-wait-s: 0.000001\r\n"
    b"x-batch-size: 1\r\nx-batch-id: 1\r\nx-forward-s: 0.000001\r\ncontent-length: 27\r\n\r\n"
    b'{"object":"list","data":[]}'
)


def _serve(port_out: multiprocessing.connection.Connection) -> None:
    """The trivial server's process: answer every request at once."""
    import httptools

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            self.transport.write(RESPONSE)  # type: ignore[attr-defined]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Answer, "127.0.0.1", 0, backlog=4096)
        port_out.send(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main())


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    processes: int
    rate: float
    report: LoadReport
    server_cpu_pct: float

    @property
    def sustained(self) -> bool:
        s = self.report.summary
        return self.report.achieved_per_s >= 0.99 * s.offered_per_s and s.ok >= 0.99 * s.sent

    @property
    def clean(self) -> bool:
        return self.sustained and self.report.kept_schedule


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="2000,5000,10000,15000,20000")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    procs = [int(p) for p in args.processes.split(",")]

    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(theirs,), daemon=True)
    server.start()
    port = mine.recv()
    assert server.pid is not None
    print(
        f"trivial server on 127.0.0.1:{port} (pid {server.pid}); {os.cpu_count()} CPUs; "
        f"load average before: {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'procs':>5} {'offered/s':>10} {'achieved/s':>10} {'ok/s':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'lag p99':>8} {'lag max':>8} {'own max':>8} {'gen CPU':>8} {'us/req':>7} "
        f"{'srv CPU':>8}  verdict"
    )
    rows: list[Row] = []
    try:
        for p in procs:
            for rate in rates:
                cfg = LoadConfig(
                    url=f"http://127.0.0.1:{port}",
                    rate=rate,
                    duration_s=args.duration,
                    processes=p,
                    texts=("a short text of a few words",),
                )
                s0, t0 = _cpu_s(server.pid), time.monotonic()
                report = run_load(cfg).report
                srv_pct = 100 * (_cpu_s(server.pid) - s0) / (time.monotonic() - t0)
                row = Row(processes=p, rate=rate, report=report, server_cpu_pct=srv_pct)
                rows.append(row)
                s = report.summary
                us = 1e6 * report.cpu_s / max(s.sent, 1)
                verdict = "clean" if row.clean else ("sustained" if row.sustained else "behind")
                print(
                    f"{p:>5} {s.offered_per_s:>10.0f} {report.achieved_per_s:>10.0f} "
                    f"{s.ok_per_s:>8.0f} {s.p50_ms:>7.2f} {s.p99_ms:>7.2f} "
                    f"{report.lag_p99_ms:>8.3f} {report.lag_max_ms:>8.2f} "
                    f"{report.dispatch_lag_max_ms:>8.2f} "
                    f"{report.cpu_core_percent:>7.0f}% {us:>7.1f} {srv_pct:>7.0f}%  {verdict}",
                    flush=True,
                )
                time.sleep(0.5)
    finally:
        server.terminate()
        server.join(5)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for p in procs:
        mine_rows = [r for r in rows if r.processes == p]
        best = max((r.rate for r in mine_rows if r.sustained), default=0.0)
        best_clean = max((r.rate for r in mine_rows if r.clean), default=0.0)
        print(
            f"{p} process{'es' if p > 1 else ''}: sustained up to {best:.0f}/s, "
            f"clean up to {best_clean:.0f}/s (of the rates tried)"
        )
        # CPU-normalized: what one core could send at the generator's measured cost, a
        # figure that does not depend on how much CPU other processes left us.
        sustained = [r for r in mine_rows if r.sustained and r.rate >= 10_000]
        if sustained:
            r = min(sustained, key=lambda r: r.rate)
            us = 1e6 * r.report.cpu_s / max(r.report.summary.sent, 1)
            print(
                f"  at {r.rate:.0f}/s the generator spent {us:.1f} us of CPU per request: "
                f"one core's worth is ~{1e6 / us:.0f} requests/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
