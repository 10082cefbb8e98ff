"""Where open-loop latency goes: the client's stopwatch beside the server's own account.

Starts ``batchserve serve`` on the null model (max batch 32, wait 2 ms, queue 1024), warms it,
then offers each ``--rates`` open loop with ``batchserve load`` for ``--seconds``, and prints
per rate: the client's p50/p99 (from each request's scheduled send), the server's p50/p99
(``Server-Timing``: from the request's first byte read to its answer), the connections the
generator had to open, and the CPU the server and the generator used. When the client's
figures run away from the server's, requests are waiting where the server's clock has not
started: in socket buffers, for the one event loop to read them.

``--server rsgi`` runs the same on ``bench/apps/rsgi_app.py`` (the same application driven by
Granian's RSGI interface, one Rust runtime thread; started as ``bench/server/request_path.py``
starts it, max batch 64).

Run: ``python bench/server/open_loop_gap.py [--rates 1900,2850,4270] [--seconds 4]
[--server batchserve|rsgi]``
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Iterator

from batchserve.loadgen import LoadConfig, run_load
from batchserve.units import parse_rates
from batchserve.workload.summary import percentile
from batchserve_testing.bench import NULL, batchserve, cpu_s, running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1900,2850,4270", help="requests per second")
    parser.add_argument("--seconds", type=float, default=4.0, help="per rate")
    parser.add_argument("--server", choices=("batchserve", "rsgi"), default="batchserve")
    args = parser.parse_args()
    rates = parse_rates(args.rates, name="--rates")
    with _server(args.server) as (url, pid):
        run_load(LoadConfig(url=url, model="m", rate=min(rates), duration_s=1.0))  # warm-up
        print(
            f"{'rate/s':>7} {'ok/s':>7} | {'client p50':>10} {'p99':>8} | {'server p50':>10} "
            f"{'p99':>8} ms | {'conns':>5} | server CPU  generator CPU"
        )
        for rate in rates:
            before = cpu_s(pid)
            run = run_load(LoadConfig(url=url, model="m", rate=rate, duration_s=args.seconds))
            used = (cpu_s(pid) - before) / args.seconds
            rec = run.records
            client = sorted(x * 1e3 for x in rec.latency_s if not math.isnan(x))
            own = sorted(x * 1e3 for x in rec.server_s if not math.isnan(x))
            print(
                f"{rate:7.0f} {run.report.summary.ok_per_s:7.0f} | "
                f"{_p(client, 0.5):>10} {_p(client, 0.99):>8} | "
                f"{_p(own, 0.5):>10} {_p(own, 0.99):>8}    | "
                f"{run.report.connections.opened:5d} | {used:9.0%}  "
                f"{run.report.cpu_core_percent:9.0f}%",
                flush=True,
            )


def _p(values: list[float], q: float) -> str:
    return f"{percentile(values, q):.2f}" if values else "-"


@contextlib.contextmanager
def _server(name: str) -> Iterator[tuple[str, int]]:
    """The server under test: its URL and process id."""
    if name == "rsgi":
        with running("batchserve-rsgi") as (port, pid):
            yield f"http://127.0.0.1:{port}", pid
        return
    flags = ["--model", NULL, "--max-batch-size", "32", "--max-wait", "2ms"]
    with batchserve([*flags, "--queue-size", "1024"]) as served:
        yield served.url, served.proc.pid


if __name__ == "__main__":
    main()
