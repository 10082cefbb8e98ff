"""The scenarios: what cells each one runs, and on which loads.

1. ``seed``: the Go seed's experiment (the synthetic model, three batching settings);
2. ``overload``: 3x and 5x the model's batched capacity;
3. ``framework``: a model that returns at once, the rate stepped up until a server fails,
   then bisected;
4. ``real``: all-MiniLM-L6-v2 on real paragraphs (:mod:`comparison.real`).

:data:`RUNNERS` maps a scenario's name to the function that runs it on a :class:`Bench`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from comparison import real
from comparison.cells import Bench
from comparison.generator import Load
from comparison.servers import Knobs, ModelSpec

__all__ = ["RUNNERS", "SCENARIOS", "capacity_per_s", "held"]

SCENARIOS = ("seed", "overload", "framework", "real")

SEED_RATE = 600.0
SEED_DEADLINE_MS = 250.0
SEED_QUEUE = 64
FIXED_MS, PER_ITEM_MS = 8.0, 0.25
SEED_CONFIGS = (
    ("max batch 32, wait 2 ms", 32, 2.0),
    ("max batch 32, wait 20 ms", 32, 20.0),
    ("batch 1", 1, 0.0),
)
OVERLOAD_FACTORS = (3.0, 5.0)
FRAMEWORK_P99_MS = 50.0
FRAMEWORK_OK_SHARE = 0.99
FRAMEWORK_START_RATE = 250.0
FRAMEWORK_STEP = 1.5
FRAMEWORK_MAX_RATE = 100_000.0
#: Bisections between the last rate held and the first that failed: 3 narrow x1.5 to ~x1.05.
FRAMEWORK_BISECTIONS = 3


def capacity_per_s(
    max_batch: int, fixed_ms: float = FIXED_MS, per_item_ms: float = PER_ITEM_MS
) -> float:
    """Items per second the synthetic model clears in full batches of ``max_batch``."""
    return max_batch / ((fixed_ms + max_batch * per_item_ms) / 1e3)


def seed_scenario(bench: Bench) -> None:
    for config, max_batch, wait_ms in SEED_CONFIGS:
        if bench.plan.quick and config != SEED_CONFIGS[0][0]:
            continue
        print(f"\n== seed: {config}, {SEED_RATE:g}/s, {SEED_DEADLINE_MS:g} ms deadline", flush=True)
        knobs = Knobs(
            max_batch=max_batch,
            max_wait_ms=wait_ms,
            queue_size=SEED_QUEUE,
            timeout_ms=SEED_DEADLINE_MS,
        )
        load = Load(rate=SEED_RATE, duration_s=bench.plan.seed_s, deadline_ms=SEED_DEADLINE_MS)
        for server in bench.servers:
            bench.cell("seed", config, server, ModelSpec(kind="sleep"), knobs, [load])


def overload_scenario(bench: Bench) -> None:
    knobs = Knobs(max_batch=32, max_wait_ms=2.0, queue_size=SEED_QUEUE, timeout_ms=SEED_DEADLINE_MS)
    bench.extra["capacity_per_s"] = capacity_per_s(32)
    for factor in OVERLOAD_FACTORS:
        rate = factor * capacity_per_s(32)
        print(
            f"\n== overload: {rate:g}/s = {factor:g}x capacity, {SEED_DEADLINE_MS:g} ms deadline",
            flush=True,
        )
        load = Load(rate=rate, duration_s=bench.plan.overload_s, deadline_ms=SEED_DEADLINE_MS)
        for server in bench.servers:
            bench.cell(
                "overload",
                f"{factor:g}x capacity, max batch 32, wait 2 ms",
                server,
                ModelSpec(kind="sleep"),
                knobs,
                [load],
                fresh_each_repeat=True,
            )


def held(run: dict[str, Any]) -> bool:
    """A framework step held: p99 within the bound and at most 1% of requests failed."""
    sent = run.get("sent", 0) or 1
    return bool(
        run.get("p99_ms", 1e9) <= FRAMEWORK_P99_MS and run.get("ok", 0) >= FRAMEWORK_OK_SHARE * sent
    )


def framework_scenario(bench: Bench) -> None:
    print(
        f"\n== framework: null model, rates x{FRAMEWORK_STEP:g} from "
        f"{FRAMEWORK_START_RATE:g}/s until p99 > {FRAMEWORK_P99_MS:g} ms",
        flush=True,
    )
    knobs = Knobs(max_batch=32, max_wait_ms=2.0, queue_size=1024, timeout_ms=1000.0)
    rates = []
    r = FRAMEWORK_START_RATE
    while r <= FRAMEWORK_MAX_RATE:
        rates.append(round(r, -1))
        r *= FRAMEWORK_STEP
    loads = [Load(rate=x, duration_s=bench.plan.step_s, deadline_ms=1000.0) for x in rates]
    config = "null model, max batch 32, wait 2 ms"
    for server in bench.servers:
        rec = bench.cell(
            "framework",
            config,
            server,
            ModelSpec(kind="null"),
            knobs,
            loads,
            stop_when=lambda runs: not all(held(x) for x in runs),
        )
        bisect_steps(bench, rec, config, knobs)


def bisect_steps(bench: Bench, rec: dict[str, Any], config: str, knobs: Knobs) -> None:
    """Narrow a framework cell's gap between its last rate held and its first failure.

    Each bisection (geometric mean of the two rates) is a cell of its own, a freshly started
    server; its step joins ``rec``'s steps in order of rate, so the report's highest rate
    held (every step below held) and first failure come from the narrowed ladder.
    """
    steps = rec["steps"]
    if rec.get("error") or not steps:
        return
    fails = [x for x in steps if not all(held(r) for r in x["runs"])]
    holds = [x["load"]["rate"] for x in steps if x not in fails]
    if not fails or not holds:
        return
    low, high = max(holds), fails[0]["load"]["rate"]
    for _ in range(FRAMEWORK_BISECTIONS):
        mid = round((low * high) ** 0.5, -1)
        if not low < mid < high:
            break
        load = Load(rate=mid, duration_s=bench.plan.step_s, deadline_ms=1000.0)
        sub = bench.cell("framework", config, rec["server"], ModelSpec(kind="null"), knobs, [load])
        bench.cells.remove(sub)
        if sub.get("error") or not sub["steps"]:
            break
        step = sub["steps"][0]
        steps.append(step)
        steps.sort(key=lambda x: x["load"]["rate"])
        if all(held(r) for r in step["runs"]):
            low = mid
        else:
            high = mid


def real_scenario(bench: Bench) -> None:
    """MiniLM on real paragraphs, every contender of ``bench.real`` (:mod:`comparison.real`)."""
    print("\n== real: all-MiniLM-L6-v2 on the paragraphs of Python's reference manual", flush=True)
    assert bench.real is not None
    record = real.run(bench.real, bench.real_contenders, bench.logs)
    bench.extra["real"] = record
    print("\n" + real.table(record), flush=True)
    if bench.real_json:
        for row in real.summary_rows(record):
            print(json.dumps(row), flush=True)


RUNNERS: dict[str, Callable[[Bench], None]] = {
    "seed": seed_scenario,
    "overload": overload_scenario,
    "framework": framework_scenario,
    "real": real_scenario,
}
