"""KServe over gRPC vs over HTTP under the same open-loop load; overload over gRPC.

Two parts, each with ``batchserve load``'s generator (:func:`batchserve.loadgen.run_load`),
which sends a ``grpc://`` URL's requests as KServe ``ModelInfer`` calls on one HTTP/2
channel and an ``http://`` URL's on HTTP/1.1 keep-alive connections, on the same schedule,
with latency from each scheduled send time:

1. **the seed's scenario** (issue 26's target: gRPC p99 <= 1.15x HTTP's): the synthetic model
   of 8 ms + 0.25 ms per item, batches of at most 32 closed after 2 ms, a queue of 64, 600
   requests/s, a 250 ms deadline (as ``bench/http_seed.py``). One server serves both
   transports; each round runs KServe over gRPC, KServe over HTTP (JSON, the same protocol)
   and OpenAI over HTTP (what ``http_seed.py`` sends), in a rotating order, on the same
   schedule. Per round: each contender's p99 and the server's own p99 (``server-timing``,
   the same on both transports), and the ratios; then the medians;
2. **overload** (targets: goodput >= 90% of capacity, no success past its deadline,
   refusals in < 5 ms by the server's own account): the reliability tests' scenario (20 ms
   + 2.5 ms per item in batches of 8: 200 items/s; 5x that offered, Poisson; 250 ms
   deadline) over gRPC and, beside it, over HTTP.

Prints figures and ratios; not a test. The machine is shared and has 2 cores (generator,
server and model share them): compare within one run.

Run: ``.venv/bin/python bench/grpc_load.py [--rounds 5] [--duration 3]
[--overload-rounds 3] [--overload-duration 20]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys

from _harness import batchserve

from batchserve.loadgen import LoadConfig, LoadRun, run_load
from batchserve.testing import scenarios

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
        verdict = "met" if ratio <= 1.15 else "MISSED"
        print(
            f"  grpc / {base}: median p99 ratio {ratio:.2f}x (target <= 1.15x: {verdict}); "
            f"server's own {own_ratio:.2f}x"
        )


def overload(args: argparse.Namespace) -> None:
    """Part 2: overload at 5x capacity over gRPC, and over HTTP beside it."""
    rows: dict[str, list[scenarios.Figures]] = {"grpc": [], "http": []}
    for r in range(args.overload_rounds):
        for protocol in ("grpc", "http") if r % 2 == 0 else ("http", "grpc"):
            f = scenarios.overload(duration_s=args.overload_duration, protocol=protocol)
            rows[protocol].append(f)
            capacity = min(f.capacity or math.nan, f.extra["model_capacity"])
            print(
                f"overload round {r + 1} {protocol:4s}: goodput {f.goodput:.1f}/s = "
                f"{f.goodput / capacity:.1%} of capacity ({capacity:.1f}/s measured, "
                f"{f.capacity:.0f} nominal), late successes {f.extra['late_ok']}, "
                f"refusal p99 {f.extra['refusal_p99_server_s'] * 1e3:.2f} ms by the server's "
                f"account ({f.refusal_p99_s * 1e3:.1f} ms from the write), lost {f.lost}, "
                f"statuses {f.extra['statuses']}, server CPU {f.extra['server_cpu']:.0%}"
            )
    for protocol, figures in rows.items():
        if not figures:
            continue
        share = statistics.median(
            f.goodput / min(f.capacity or math.nan, f.extra["model_capacity"]) for f in figures
        )
        late = max(f.extra["late_ok"] for f in figures)
        refusal = statistics.median(f.extra["refusal_p99_server_s"] for f in figures) * 1e3
        print(
            f"overload {protocol}: median goodput {share:.1%} of capacity (target >= 90%: "
            f"{'met' if share >= 0.9 else 'MISSED'}), most late successes in a run {late} "
            f"(target 0), median refusal p99 {refusal:.2f} ms by the server's account "
            f"(target < 5 ms: {'met' if refusal < 5 else 'MISSED'})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per seed run")
    parser.add_argument("--rounds", type=int, default=5, help="seed rounds (0: skip)")
    parser.add_argument("--overload-duration", type=float, default=20.0)
    parser.add_argument("--overload-rounds", type=int, default=3, help="0: skip")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
