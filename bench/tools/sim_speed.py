"""How many simulated requests per wall-clock second the simulator handles.

Each scenario offers about a million requests (Poisson arrivals, seeded) to the server's
batching policy on virtual time and times the whole ``simulate`` call (the schedule is built
beforehand), best of ``--repeat`` runs:

* ``seed``: the Go seed's model (8 ms + 0.25 ms per item) at 600/s, batch <= 32, wait 2 ms,
  queue 64, deadline 250 ms: ~5.7 items per pass, nothing refused (about 28 virtual minutes);
* ``fast model``: 2 ms + 20 us per item at 20,000/s, batch <= 128, wait 1 ms, queue 4096:
  big batches, so the per-pass work is spread thin;
* ``overload``: the seed's model at 1,500/s with batch <= 8 (it can serve ~800/s): half the
  requests are refused at admission, each refusal an exception.

Besides wall-clock requests per second it prints CPU-time requests per second and the time
of an empty Python loop iteration, so a figure taken on a busy shared machine can be read
against the machine's speed at that moment. The aim is 200,000 requests per wall second.

Run: ``python bench/tools/sim_speed.py [--requests 1000000] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import time

from batchserve.config import BatchConfig, CostEstimate
from batchserve.sim import simulate
from batchserve.workload.arrivals import arrival_times

SEED_COST = CostEstimate(fixed_s=0.008, per_item_s=0.00025)


def scenarios(requests: int) -> list[tuple[str, float, BatchConfig, CostEstimate]]:
    return [
        (
            "seed (600/s, batch<=32)",
            600.0,
            BatchConfig(max_batch_size=32, max_wait_s=0.002, queue_size=64),
            SEED_COST,
        ),
        (
            "fast model (20k/s, batch<=128)",
            20_000.0,
            BatchConfig(max_batch_size=128, max_wait_s=0.001, queue_size=4096),
            CostEstimate(fixed_s=0.002, per_item_s=0.00002),
        ),
        (
            "overload (1500/s, batch<=8)",
            1_500.0,
            BatchConfig(max_batch_size=8, max_wait_s=0.002, queue_size=64),
            SEED_COST,
        ),
    ]


def loop_ns(n: int = 2_000_000) -> float:
    t0 = time.process_time()
    x = 0
    for i in range(n):
        x += i
    return (time.process_time() - t0) / n * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"simulator speed, ~{args.requests:,} requests per scenario, best of {args.repeat}")
    print(f"empty Python loop: {loop_ns():.1f} ns per iteration (machine speed now)\n")
    print(f"{'scenario':<32} {'requests':>9} {'wall s':>7} {'req/s wall':>11} {'req/s cpu':>10}")
    for name, rate, config, cost in scenarios(args.requests):
        duration_s = args.requests / rate
        arrivals = arrival_times(rate=rate, duration_s=duration_s, arrivals="poisson", seed=1)
        best_wall = best_cpu = float("inf")
        result = None
        for _ in range(args.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            result = simulate(
                config=config, cost=cost, arrivals=arrivals, timeout_s=0.25, duration_s=duration_s
            )
            best_wall = min(best_wall, time.perf_counter() - w0)
            best_cpu = min(best_cpu, time.process_time() - c0)
        n = len(arrivals)
        print(f"{name:<32} {n:>9,} {best_wall:7.2f} {n / best_wall:11,.0f} {n / best_cpu:10,.0f}")
        assert result is not None
        s = result.summary
        print(
            f"{'':<32} ok {s.ok:,}  rejected {s.rejected:,}  batch {s.avg_batch:.1f}  "
            f"p99 {s.p99_ms:.1f} ms"
        )
    print("\nfigures from a shared machine are noisy; compare within one run")


if __name__ == "__main__":
    main()
