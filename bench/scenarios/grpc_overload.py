"""Overload over gRPC, beside HTTP: goodput, late successes, and what a refusal costs.

The seed's scenario over gRPC beside HTTP is ``bench/scenarios/seed.py --via http,grpc``
(with ``--client perf_analyzer`` for a C++ client both ways). This script asks another
question: how the gRPC carrier behaves past capacity. Two parts:

1. **overload with** ``batchserve load``'s generator (goodput as a share of capacity,
   successes past their deadline, the refusals' p99 by the server's own account): the
   reliability tests' scenario (20 ms + 2.5 ms per item in batches of 8: 200 items/s; 5x
   that offered, Poisson; 250 ms deadline) over gRPC and, beside it, over HTTP.

   Over gRPC twice: with the server's defaults (grpcio's bound on calls in flight derived
   from the queue, far above what this scenario admits) and with ``serve --grpc-max-calls
   --max-calls`` (default 128), a bound that bites: the calls past it are refused by
   grpcio before any handler runs (the server never counts them: they are the calls sent
   less those received);
2. **overload through a C client**: perf_analyzer cannot drive it (it aborts at the first
   refusal, and at 5x capacity most calls are refused), so nghttp2's ``h2load`` sends the
   same ``ModelInfer`` (gRPC framing by hand, ``x-request-timeout: 0.25``) at 1,000 calls/s
   on one HTTP/2 connection (``--rps``: evenly spaced, not Poisson; up to 4,096 calls in
   flight, so sends never wait for answers). h2load reads no gRPC status, so the server's
   own counters (``/metrics`` before and after) judge: goodput is the successes by their
   deadline per second of the run over the model's capacity (as in part 1), the late
   successes must be 0, and the calls grpcio refused are those sent less those received.
   With the defaults and with ``--grpc-max-calls``, alternated.

Prints figures and ratios; not a test. The machine is shared and has 2 cores (generator,
server and model share them): compare within one run.

Run: ``python bench/scenarios/grpc_overload.py [--overload-rounds 3] [--overload-duration 20]
[--max-calls 128] [--h2load-rounds 3]`` (a part with 0 rounds is skipped)
"""

from __future__ import annotations

import argparse
import math
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

from batchserve.server.protocols.proto import grpc_service_pb2 as pb
from batchserve.server.protocols.tensors import pack_bytes
from batchserve_testing import harness, scenarios
from batchserve_testing.tools import find_h2load


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


# -- part 2: overload through h2load ----------------------------------------------------------


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
    parser.add_argument("--overload-duration", type=float, default=20.0)
    parser.add_argument("--overload-rounds", type=int, default=3, help="0: skip")
    parser.add_argument("--max-calls", type=int, default=128, help="the bounded contender's")
    parser.add_argument("--h2load-rounds", type=int, default=3, help="overload via h2load")
    args = parser.parse_args()
    if args.overload_rounds:
        print(f"overload: 5x capacity, {args.overload_duration:g} s per run\n")
        overload(args)
    if args.h2load_rounds:
        print(f"\noverload through h2load: 5x capacity, {args.overload_duration:g} s per run\n")
        overload_h2load(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
