"""What ``--otel`` costs a request: ``batchserve serve`` with and without it, side by side.

The null model (it costs nothing; max batch 64, max wait 2 ms), ``wrk`` closed loop (one
thread, 64 connections) for ``--seconds``, ``--rounds`` times interleaved, as
``bench/request_path.py`` runs it. With ``--otel`` every request and pass becomes a span
that the SDK's batch processor hands to an exporter; the console exporter writing to
/dev/null stands in for a collector (``OTEL_TRACES_EXPORTER=console``), so what is measured
is the spans' making, not a network. Without ``--otel`` nothing of OpenTelemetry is loaded
(``tests/server/test_server_tracing.py`` checks it), so "off" is the plain server.

Run: ``.venv/bin/python bench/otel_overhead.py [--rounds 3] [--seconds 4]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

from request_path import NULL, ROOT, answers, free_port, wrk


@contextlib.contextmanager
def serving(otel: bool) -> Iterator[int]:
    port = free_port()
    cmd = [sys.executable, "-m", "batchserve", "serve", "--port", str(port), "--model", NULL]
    cmd += ["--max-batch-size", "64", "--max-wait", "2ms"] + (["--otel"] if otel else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OTEL_TRACES_EXPORTER": "console"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    try:
        for _ in range(300):
            if answers(port):
                break
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"off": [], "--otel": []}
    for r in range(args.rounds):
        for name in rates:
            with serving(name == "--otel") as port:
                rate, bad = wrk(port, args.seconds)
            print(f"round {r + 1} {name:<8} {rate:8.0f} req/s  non-2xx {bad}", flush=True)
            rates[name].append(rate)
    off = statistics.median(rates["off"])
    on = statistics.median(rates["--otel"])
    print(f"\nclosed loop, wrk -t1 -c64, {args.seconds} s x {args.rounds} rounds, null model")
    print(f"off     {off:8.0f} req/s (median)  1.00")
    print(f"--otel  {on:8.0f} req/s (median)  {on / off:.2f}")


if __name__ == "__main__":
    main()
