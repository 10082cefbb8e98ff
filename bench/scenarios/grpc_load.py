"""KServe over gRPC vs over HTTP under the same open-loop load; overload over gRPC.

Two parts, each with ``batchserve load``'s generator (:func:`batchserve.loadgen.run_load`),
which sends a ``grpc://`` URL's requests as KServe ``ModelInfer`` calls on one HTTP/2
channel and an ``http://`` URL's on HTTP/1.1 keep-alive connections, on the same schedule,
with latency from each scheduled send time:

1. **the seed's scenario**: the synthetic model
   of 8 ms + 0.25 ms per item, batches of at most 32 closed after 2 ms, a queue of 64, 600
   requests/s, a 250 ms deadline (as ``bench/http_seed.py``). One server serves both
   transports; each round runs KServe over gRPC, KServe over HTTP (JSON, the same protocol)
   and OpenAI over HTTP (what ``http_seed.py`` sends), in a rotating order, on the same
   schedule. Per round: each contender's p99 and the server's own p99 (``server-timing``,
   the same on both transports), and the ratios; then the medians;
2. **overload** (goodput as a share of capacity, successes past their deadline, the
   refusals' p99 by the server's own account): the reliability tests' scenario (20 ms
   + 2.5 ms per item in batches of 8: 200 items/s; 5x that offered, Poisson; 250 ms
   deadline) over gRPC and, beside it, over HTTP.

   Over gRPC twice: with the server's defaults (grpcio's bound on calls in flight derived
   from the queue, far above what this scenario admits) and with ``serve --grpc-max-calls
   --max-calls`` (default 128), a bound that bites: the calls past it are refused by
   grpcio before any handler runs (the server never counts them: they are the calls sent
   less those received);
3. **the seed's scenario through Triton's perf_analyzer** (C++ client, the same one both
   ways, so the client's own cost no longer differs between the transports):
   ``perf_analyzer -i http`` and ``-i grpc``, ``--async --request-rate-range 600
   --request-distribution poisson --percentile=99``, three windows of ``--pa-window`` ms,
   alternated in each round against one server; each run's p99 from its CSV, the median of
   the per-round ratios gRPC / HTTP. perf_analyzer stops at the first failed request, so a
   run with one refusal is reported as such and left out of the ratio;
4. **overload through a C client**: perf_analyzer cannot drive it (it aborts at the first
   refusal, and at 5x capacity most calls are refused), so nghttp2's ``h2load`` sends the
   same ``ModelInfer`` (gRPC framing by hand, ``x-request-timeout: 0.25``) at 1,000 calls/s
   on one HTTP/2 connection (``--rps``: evenly spaced, not Poisson; up to 4,096 calls in
   flight, so sends never wait for answers). h2load reads no gRPC status, so the server's
   own counters (``/metrics`` before and after) judge: goodput is the successes by their
   deadline per second of the run over the model's capacity (as in part 2), the late
   successes must be 0, and the calls grpcio refused are those sent less those received.
   With the defaults and with ``--grpc-max-calls``, alternated.

Prints figures and ratios; not a test. The machine is shared and has 2 cores (generator,
server and model share them): compare within one run.

Run: ``.venv/bin/python bench/grpc_load.py [--rounds 5] [--duration 3]
[--overload-rounds 3] [--overload-duration 20] [--max-calls 128] [--pa-rounds 5]
[--pa-window 3000] [--h2load-rounds 3]`` (a part with 0 rounds is skipped)
"""

from __future__ import annotations

import argparse
import csv
import math
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _harness import batchserve

from batchserve.loadgen import LoadConfig, LoadRun, run_load
from batchserve.server.protocols.proto import grpc_service_pb2 as pb
from batchserve.server.protocols.tensors import pack_bytes
from batchserve_testing import harness, scenarios
from batchserve_testing.tools import find_h2load, find_perf_analyzer

SEED_FLAGS = [
    "--model", "seed=synthetic:fixed=8ms,per_item=0.25ms,dim=8",
    "--max-batch-size", "32",
    "--max-wait", "2ms",
    "--queue-size", "64",
    "--timeout", "250ms",
    "--grpc-port", "0",
]  # fmt: skip


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank) of the finite values, NaN if none."""
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return math.nan
    return finite[min(len(finite) - 1, math.ceil(0.99 * len(finite)) - 1)]


def server_p99_ms(run: LoadRun) -> float:
    """The p99 of the successes' time by the server's own account, in ms."""
    records = run.records
    ok = [s for s, st in zip(records.server_s, records.status, strict=True) if st == 200]
    return p99(ok) * 1e3


def seed(args: argparse.Namespace) -> None:
    """Part 1: the seed's scenario over three contenders, side by side."""
    with batchserve(SEED_FLAGS) as served:
        assert served.grpc is not None
        urls = {
            "grpc": (f"grpc://{served.grpc}", "kserve"),
            "http-kserve": (served.url, "kserve"),
            "http-openai": (served.url, "openai"),
        }

        def config(name: str, duration_s: float) -> LoadConfig:
            url, api = urls[name]
            return LoadConfig(
                url=url,
                api=api,
                model="seed",
                rate=args.rate,
                duration_s=duration_s,
                timeout_s=0.25,
                name=name,
            )

        for name in urls:  # warm-up: the cost model measures the model, connections open
            run_load(config(name, 1.0))
        names = list(urls)
        p99s: dict[str, list[float]] = {n: [] for n in names}
        own: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            order = names[r % 3 :] + names[: r % 3]
            print(f"round {r + 1} ({', '.join(order)}):")
            for name in order:
                run = run_load(config(name, args.duration))
                s = run.report.summary
                p99s[name].append(s.p99_ms)
                own[name].append(server_p99_ms(run))
                print(
                    f"  {name:12s} served {s.ok / s.sent:7.2%}  p99 {s.p99_ms:6.1f} ms  "
                    f"server's own p99 {own[name][-1]:6.1f} ms  rejected {s.rejected}  "
                    f"timed out {s.timed_out}  errors {s.errors}  "
                    f"generator lag p99 {run.report.lag_p99_ms:.1f} ms, "
                    f"CPU {run.report.cpu_core_percent:.0f}% of a core"
                )
            for base in ("http-kserve", "http-openai"):
                print(
                    f"  grpc / {base}: p99 {p99s['grpc'][-1] / p99s[base][-1]:.2f}x, "
                    f"server's own p99 {own['grpc'][-1] / own[base][-1]:.2f}x"
                )
    print(f"\nmedians over {args.rounds} rounds:")
    for name in names:
        print(
            f"  {name:12s} p99 {statistics.median(p99s[name]):6.1f} ms  server's own p99 "
            f"{statistics.median(own[name]):6.1f} ms"
        )
    for base in ("http-kserve", "http-openai"):
        ratio = statistics.median(g / h for g, h in zip(p99s["grpc"], p99s[base], strict=True))
        own_ratio = statistics.median(g / h for g, h in zip(own["grpc"], own[base], strict=True))
        print(f"  grpc / {base}: median p99 ratio {ratio:.2f}x; server's own {own_ratio:.2f}x")


def overload(args: argparse.Namespace) -> None:
    """Part 2: overload at 5x capacity over gRPC (twice) and over HTTP beside it."""
    bounded = f"grpc max-calls {args.max_calls}"
    contenders: dict[str, tuple[str, list[str]]] = {
        "grpc": ("grpc", []),
        bounded: ("grpc", ["--grpc-max-calls", str(args.max_calls)]),
        "http": ("http", []),
    }
    names = list(contenders)
    rows: dict[str, list[scenarios.Figures]] = {n: [] for n in names}
    for r in range(args.overload_rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            protocol, server_args = contenders[name]
            f = scenarios.overload(
                duration_s=args.overload_duration, protocol=protocol, server_args=server_args
            )
            rows[name].append(f)
            capacity = min(f.capacity or math.nan, f.extra["model_capacity"])
            print(
                f"overload round {r + 1} {name}: goodput {f.goodput:.1f}/s = "
                f"{f.goodput / capacity:.1%} of capacity ({capacity:.1f}/s measured, "
                f"{f.capacity:.0f} nominal), late successes {f.extra['late_ok']}, "
                f"refusal p99 {f.extra['refusal_p99_server_s'] * 1e3:.2f} ms by the server's "
                f"account ({f.refusal_p99_s * 1e3:.1f} ms from the write), lost {f.lost}, "
                f"statuses {f.extra['statuses']}, server CPU {f.extra['server_cpu']:.0%}"
            )
    for name, figures in rows.items():
        if not figures:
            continue
        share = statistics.median(
            f.goodput / min(f.capacity or math.nan, f.extra["model_capacity"]) for f in figures
        )
        late = max(f.extra["late_ok"] for f in figures)
        refusal = statistics.median(f.extra["refusal_p99_server_s"] for f in figures) * 1e3
        print(
            f"overload {name}: median goodput {share:.1%} of capacity, most late successes "
            f"in a run {late}, median refusal p99 {refusal:.2f} ms by the server's account"
        )


# -- part 3: the seed's scenario through perf_analyzer ----------------------------------------

#: The one text perf_analyzer sends in every request (its ``--string-data``).
PA_TEXT = "the quick brown fox jumps over the lazy dog"


def perf_analyzer(address: str, protocol: str, window_ms: int, rate: float) -> dict[str, Any]:
    """One perf_analyzer run at ``rate`` (Poisson, async): its figures, or its ``error``."""
    binary, env = find_perf_analyzer()
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "pa.csv"
        cmd = [
            binary, "-m", "seed", "-u", address, "-i", protocol, "--async",
            "--request-rate-range", f"{rate:g}", "--request-distribution", "poisson",
            "-p", str(window_ms), "-r", "3", "-s", "1000", "--percentile=99",
            "--string-data", PA_TEXT, "-f", str(out),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        text = done.stdout + done.stderr
        if done.returncode != 0 or not out.exists():
            errors = [line.strip() for line in text.splitlines() if "error" in line.lower()]
            return {"error": errors[0] if errors else text[-300:]}
        row = next(csv.DictReader(out.open()))
    delayed = re.search(r"([\d.]+)% of the requests were delayed", text)
    server = re.search(r"Avg request latency: (\d+) usec", text)
    return {
        "p99_ms": float(row["p99 latency"]) / 1e3,
        "p50_ms": float(row["p50 latency"]) / 1e3,
        "throughput": float(row["Inferences/Second"]),
        "delayed": float(delayed.group(1)) if delayed else 0.0,
        "server_mean_ms": float(server.group(1)) / 1e3 if server else math.nan,
    }


def seed_perf_analyzer(args: argparse.Namespace) -> None:
    """Part 3: the seed's scenario, perf_analyzer over HTTP and over gRPC, alternated."""
    with batchserve(SEED_FLAGS) as served:
        assert served.grpc is not None
        addresses = {"http": f"{served.host}:{served.port}", "grpc": served.grpc}
        for protocol, address in addresses.items():  # warm-up: connections, the cost model
            perf_analyzer(address, protocol, 1000, args.rate)
        p99s: dict[str, list[float]] = {"http": [], "grpc": []}
        ratios: list[float] = []
        for r in range(args.pa_rounds):
            order = ("http", "grpc") if r % 2 == 0 else ("grpc", "http")
            got: dict[str, dict[str, Any]] = {}
            for protocol in order:
                got[protocol] = f = perf_analyzer(
                    addresses[protocol], protocol, args.pa_window, args.rate
                )
                if "error" in f:
                    print(f"  round {r + 1} {protocol:4s}: perf_analyzer stopped: {f['error']}")
                    continue
                p99s[protocol].append(f["p99_ms"])
                print(
                    f"  round {r + 1} {protocol:4s}: p99 {f['p99_ms']:6.1f} ms  p50 "
                    f"{f['p50_ms']:5.1f} ms  {f['throughput']:5.0f} answers/s  sends delayed "
                    f"{f['delayed']:.1f}%  server's own mean {f['server_mean_ms']:.1f} ms"
                )
            if all("error" not in f for f in got.values()):
                ratios.append(got["grpc"]["p99_ms"] / got["http"]["p99_ms"])
                print(f"  round {r + 1}: grpc / http p99 {ratios[-1]:.2f}x")
    if ratios:
        ratio = statistics.median(ratios)
        print(
            f"perf_analyzer, median over {len(ratios)} rounds: http p99 "
            f"{statistics.median(p99s['http']):.1f} ms, grpc p99 "
            f"{statistics.median(p99s['grpc']):.1f} ms; grpc / http {ratio:.2f}x"
        )


# -- part 4: overload through h2load ----------------------------------------------------------


def grpc_frame(texts: list[str]) -> bytes:
    """A ``ModelInfer`` request of ``texts`` for the overload model, in gRPC's framing."""
    msg = pb.ModelInferRequest(model_name="faulty")
    msg.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    msg.raw_input_contents.append(pack_bytes([t.encode() for t in texts]))
    body = msg.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


def h2load(address: str, body: pathlib.Path, rate: float, seconds: float) -> int:
    """Send ``rate`` calls/s for ``seconds`` on one connection; the calls h2load sent."""
    n = int(rate * seconds)
    cmd = [
        find_h2load(), "-n", str(n), "-c", "1", "-m", "4096",
        "--rps", f"{rate:g}", "-d", str(body),
        "-H", "content-type: application/grpc", "-H", "te: trailers",
        "-H", "x-request-timeout: 0.25",
        f"http://{address}/inference.GRPCInferenceService/ModelInfer",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"h2load failed:\n{done.stdout}{done.stderr}")
    return int(found.group(3))


def overload_h2load(args: argparse.Namespace) -> None:
    """Part 4: overload over gRPC from a C client, judged by the server's own counters."""
    rate = 5 * scenarios.OVERLOAD_CAPACITY
    env = {"BATCHSERVE_FAULT_COST": scenarios.OVERLOAD_COST}
    flags = [
        "--model", harness.FAULTY, "--max-batch-size", str(scenarios.OVERLOAD_BATCH),
        "--max-wait", "2ms", "--grpc-port", "0",
    ]  # fmt: skip
    contenders = {
        "grpc": [],
        f"grpc max-calls {args.max_calls}": ["--grpc-max-calls", str(args.max_calls)],
    }
    names = list(contenders)
    shares: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        body = pathlib.Path(tmp) / "infer.bin"
        body.write_bytes(grpc_frame(["some text to embed"]))
        for r in range(args.h2load_rounds):
            for name in names[r % 2 :] + names[: r % 2]:
                with harness.serve([*flags, *contenders[name]], env) as server:
                    assert server.grpc_url is not None
                    address = server.grpc_url.removeprefix("grpc://")
                    h2load(address, body, rate, 3.0)  # warm-up
                    before = server.scrape()
                    cpu0, t0 = server.cpu_s(), time.monotonic()
                    sent = h2load(address, body, rate, args.overload_duration)
                    wall = time.monotonic() - t0
                    cpu = (server.cpu_s() - cpu0) / wall
                    after = server.scrape()

                def delta(name: str, **labels: str) -> float:
                    return after.value(name, **labels) - before.value(name, **labels)  # noqa: B023 - called at once

                forward_s = delta("batchserve_forward_seconds_sum")
                items = delta("batchserve_batch_size_sum")
                capacity = min(scenarios.OVERLOAD_CAPACITY, items / forward_s)
                ok = delta("batchserve_requests_total", outcome="ok")
                late = delta("batchserve_requests_total", outcome="late")
                received = delta("batchserve_requests_received_total")
                refused = delta("batchserve_requests_total", outcome="rejected")
                expired = delta("batchserve_requests_total", outcome="expired")
                goodput = ok / wall
                shares[name].append(goodput / capacity)
                print(
                    f"h2load round {r + 1} {name}: goodput {goodput:.1f}/s = "
                    f"{goodput / capacity:.1%} of capacity ({capacity:.1f}/s measured), "
                    f"late (504 after their pass) {late:.0f}; sent {sent}, "
                    f"received {received:.0f} "
                    f"(grpcio refused {sent - received:.0f}), refused by the server "
                    f"{refused:.0f}, expired {expired:.0f}, ok {ok:.0f}; server CPU {cpu:.0%}"
                )
    for name in names:
        if shares[name]:
            share = statistics.median(shares[name])
            print(f"overload via h2load, {name}: median goodput {share:.1%} of capacity")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per seed run")
    parser.add_argument("--rounds", type=int, default=5, help="seed rounds (0: skip)")
    parser.add_argument("--overload-duration", type=float, default=20.0)
    parser.add_argument("--overload-rounds", type=int, default=3, help="0: skip")
    parser.add_argument("--max-calls", type=int, default=128, help="the bounded contender's")
    parser.add_argument("--pa-rounds", type=int, default=5, help="perf_analyzer rounds")
    parser.add_argument("--pa-window", type=int, default=3000, help="perf_analyzer window, ms")
    parser.add_argument("--h2load-rounds", type=int, default=3, help="overload via h2load")
    args = parser.parse_args()
    if args.rounds:
        print(
            f"seed scenario: 8 ms + 0.25 ms/item, batch <= 32, wait 2 ms, queue 64, "
            f"{args.rate:g} req/s for {args.duration:g} s, deadline 250 ms\n"
        )
        seed(args)
    if args.overload_rounds:
        print(f"\noverload: 5x capacity, {args.overload_duration:g} s per run\n")
        overload(args)
    if args.pa_rounds:
        print(f"\nseed scenario through perf_analyzer, {args.rate:g} req/s, Poisson\n")
        seed_perf_analyzer(args)
    if args.h2load_rounds:
        print(f"\noverload through h2load: 5x capacity, {args.overload_duration:g} s per run\n")
        overload_h2load(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
