"""What ``--otel`` costs a request: ``batchserve serve`` with and without it, side by side.

The null model (it costs nothing; max batch 64, max wait 2 ms), ``wrk`` closed loop (one
thread, 64 connections) for ``--seconds``, ``--rounds`` times interleaved, as
``bench/request_path.py`` runs it. With ``--otel`` every request and pass becomes a span
that the SDK's batch processor hands to an exporter; the console exporter writing to
/dev/null stands in for a collector (``OTEL_TRACES_EXPORTER=console``), so what is measured
is the spans' making, not a network; ``OTEL_TRACES_EXPORTER=none`` measures the spans alone,
made and dropped. Without ``--otel`` nothing of OpenTelemetry is loaded
(``tests/server/ops/test_tracing.py`` checks it), so "off" is the plain server.

Run: ``.venv/bin/python bench/otel_overhead.py [--rounds 3] [--seconds 4]``
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Iterator

from _harness import NULL, batchserve, wrk

#: What each contender runs with: --otel or not, and OTEL_TRACES_EXPORTER.
CONTENDERS = {"off": None, "--otel, spans dropped": "none", "--otel, console": "console"}


@contextlib.contextmanager
def serving(exporter: str | None) -> Iterator[int]:
    flags = ["--model", NULL, "--max-batch-size", "64", "--max-wait", "2ms"]
    env = {"OTEL_TRACES_EXPORTER": exporter or "none"}
    with batchserve(flags + (["--otel"] if exporter else []), env=env) as served:
        yield served.port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for r in range(args.rounds):
        for name, exporter in CONTENDERS.items():
            with serving(exporter) as port:
                rate, bad = wrk(port, args.seconds)
            print(f"round {r + 1} {name:<22} {rate:8.0f} req/s  non-2xx {bad}", flush=True)
            rates[name].append(rate)
    print(f"\nclosed loop, wrk -t1 -c64, {args.seconds} s x {args.rounds} rounds, null model")
    off = statistics.median(rates["off"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<22} {median:8.0f} req/s (median)  {median / off:.2f}")


if __name__ == "__main__":
    main()
