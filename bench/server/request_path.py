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

``--otel`` measures what tracing costs instead: ``batchserve`` without ``--otel``, then with
it, its spans made and dropped (``OTEL_TRACES_EXPORTER=none``) and written by the console
exporter to /dev/null, a stand-in for a collector (the spans' making, not a network), the
ratios to the first. Without ``--otel`` nothing of OpenTelemetry is loaded
(``tests/server/ops/test_tracing.py`` checks it), so the first is the plain server.

``--profile`` also records a py-spy flame graph of ``batchserve`` during one extra run into
``bench/out/request_path-<time>.svg`` (``pip install py-spy``). The CPU a contender uses is
measured from ``/proc`` over its runs and printed as CPU seconds per 1,000 requests.

Run: ``python bench/server/request_path.py [--rounds 5] [--seconds 4] [--otel] [--profile]
[--json]``
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

from batchserve_testing.bench import CONTENDERS, OTEL_CONTENDERS, OUT, cpu_s, running, wrk

BIN = pathlib.Path(sys.executable).parent


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
    args = parser.parse_args()
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
