"""Mixed traffic on one server: classes of work and tenants against today's FIFO, measured
beside what the simulator predicts.

The scenario of issue 15: a model of about 2,000 items/s (a sleeping synthetic model,
22 ms + 0.16 ms per item, max batch 64: 1,985 items/s), interactive queries at 200
requests/s (one text, 100 ms deadline) beside a bulk job offering 4,000 texts/s in
requests of 64 (30 s deadline); then two tenants each offering 2x capacity of bulk work.
Each runs under two policies on the same server settings:

* ``classes``: ``--class interactive:share=0.25,timeout=100ms --class
  bulk:share=0.75,timeout=30s,max_wait=20ms --tenant-share 0.5`` (queries first in every
  pass at their weighted share, tenants by deficit round robin, each bounded to half of its
  class's queue);
* ``fifo``: no classes, one queue, as today (the same requests, headers ignored).

For every policy and stream it prints one row: ``policy, scenario, class, tenant,
offered_per_s, ok_per_s`` (items per second), ``p50_ms, p99_ms`` (of ok requests, from the
scheduled send), ``rejected, timed_out, alone_p99_ms`` (the same class's p99 when it runs
alone under the same policy), then the simulator's ``predicted_*`` for the same schedule
(:func:`batchserve.sim.simulate_mix`), and ``ok_vs_predicted``. The measured side is a real
``batchserve serve`` on 127.0.0.1 driven by ``batchserve load --mix`` (one sender process
per stream). Then one line per policy: interactive p99 over its p99 alone and its refusals;
bulk goodput as a share of the capacity the queries leave; each tenant's share; and the
worst gap between measured and predicted ok/s.

With ``--builtin`` it serves the built-in model (all-MiniLM-L6-v2, texts of mixed lengths)
with the same two classes instead (one worker kept for the queries: ``reserve=1``;
``--reserve 0`` keeps none), once with passes formed by tokens (``--batch-by tokens``)
and once by count, and prints interactive p99 beside bulk's, each alone and mixed, side by
side for the two (measured only: the simulator has no model of its texts). Each row also
says how the server formed its passes (``batch_by`` from its ``/status``).

Run: ``python bench/scenarios/mixed_traffic.py [--json] [--duration 5] [--simulate-only]``
(about a minute measured; a second simulated only), or ``... --builtin [--interactive 10]
[--bulk 2] [--bulk-inputs 32]`` (requests/s of each class).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from batchserve.config import BatchConfig, CostEstimate
from batchserve.policy import ClassConfig
from batchserve.policy.classes import parse_class
from batchserve.sim.mix import parse_stream, simulate_mix
from batchserve_testing.bench import batchserve

ROOT = pathlib.Path(__file__).resolve().parents[2]
COST = CostEstimate(fixed_s=0.022, per_item_s=0.00016)
MAX_BATCH = 64
CAPACITY = MAX_BATCH / COST.cost(MAX_BATCH)
MODEL = "m=synthetic:fixed=22ms,per_item=0.16ms,dim=8"
SERVER = ["--max-batch-size", "64", "--max-wait", "2ms", "--queue-size", "1024"]
CLASS_FLAGS = [
    *("--class", "interactive:share=0.25,timeout=100ms"),
    *("--class", "bulk:share=0.75,timeout=30s,max_wait=20ms"),
    *("--tenant-share", "0.5"),
]
CLASSES = ClassConfig(
    classes=(
        parse_class("interactive:share=0.25,timeout=100ms"),
        parse_class("bulk:share=0.75,timeout=30s,max_wait=20ms"),
    ),
    tenant_share=0.5,
)
QUERIES = "interactive:rate=200,inputs=1,timeout=100ms,arrivals=poisson,seed=1"
BULK = "bulk:rate=62.5,inputs=64,timeout=30s,arrivals=poisson,seed=2"
TENANT_A = "bulk:rate=62.5,inputs=64,timeout=30s,tenant=a,arrivals=poisson,seed=3"
TENANT_B = "bulk:rate=62.5,inputs=64,timeout=30s,tenant=b,arrivals=poisson,seed=4"
#: (scenario, streams); "alone" runs give each class's alone p99.
SCENARIOS = (
    ("interactive alone", [QUERIES]),
    ("bulk alone", [BULK]),
    ("mixed", [QUERIES, BULK]),
    ("tenants", [TENANT_A, TENANT_B]),
)
POLICIES = ("classes", "fifo")


def config() -> BatchConfig:
    """The server's batcher settings (its cost model starts from the model's stated cost)."""
    return BatchConfig(
        max_batch_size=MAX_BATCH, max_wait_s=0.002, queue_size=1024, initial_cost=COST
    )


def predict(
    policy: str, streams: list[str], duration_s: float, overhead_s: float
) -> list[dict[str, Any]]:
    """The simulator's rows for one scenario under one policy."""
    result = simulate_mix(
        config=config(),
        cost=COST,
        streams=[parse_stream(s) for s in streams],
        duration_s=duration_s,
        classes=CLASSES if policy == "classes" else None,
        overhead_s=overhead_s,
    )
    return [f.to_dict() for f in result.streams]


@contextlib.contextmanager
def server(policy: str) -> Iterator[str]:
    """A real ``batchserve serve`` with the scenario's settings; yields its URL."""
    flags = ["--model", MODEL, *SERVER, *(CLASS_FLAGS if policy == "classes" else [])]
    with batchserve(flags) as served:
        yield served.url


def measure(
    url: str,
    streams: list[str],
    duration_s: float,
    model: str = "m",
    extra: list[str] | None = None,
) -> list[dict[str, Any]]:
    """``batchserve load --mix`` against ``url``: one row per stream, rates in items/s."""
    args = [sys.executable, "-m", "batchserve", "load", url, "--model", model, "--json"]
    args += ["--quiet", "--duration", f"{duration_s}s", *(extra or [])]
    for s in streams:
        args += ["--mix", s]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"load failed: {out.stderr}")
    rows = []
    for line, text in zip(out.stdout.splitlines(), streams, strict=True):
        r = json.loads(line)
        n = parse_stream(text).inputs
        rows.append(
            {
                "class": r["priority"],
                "tenant": r["tenant"] or "",
                "offered_per_s": r["offered_per_s"] * n,
                "ok_per_s": r["ok_per_s"] * n,
                "p50_ms": r["p50_ms"],
                "p99_ms": r["p99_ms"],
                "rejected": r["rejected"],
                "timed_out": r["timed_out"],
            }
        )
    return rows


KEYS = ("class", "tenant", "offered_per_s", "ok_per_s", "p50_ms", "p99_ms", "rejected", "timed_out")


#: The built-in model's classes: a query waits at most a second, bulk work half a minute.
def builtin_classes(reserve: int) -> list[str]:
    """The built-in model's classes; ``reserve`` workers kept for the queries."""
    keep = f",reserve={reserve}" if reserve else ""
    return [
        *("--class", f"interactive:share=0.25,timeout=1s{keep}"),
        *("--class", "bulk:share=0.75,timeout=30s,max_wait=20ms"),
    ]


BUILTIN_NAME = "all-MiniLM-L6-v2"
BATCH_BY = ("tokens", "count")


def builtin_streams(args: argparse.Namespace) -> tuple[tuple[str, list[str]], ...]:
    """The built-in model's scenarios: each class alone, then both."""
    queries = f"interactive:rate={args.interactive},inputs=1,timeout=1s,arrivals=poisson,seed=1"
    bulk = f"bulk:rate={args.bulk},inputs={args.bulk_inputs},timeout=30s,arrivals=poisson,seed=2"
    return (
        ("interactive alone", [queries]),
        ("bulk alone", [bulk]),
        ("mixed", [queries, bulk]),
    )


def batch_by_of(url: str) -> str:
    """How the server forms its passes, as its ``/status`` says."""
    with urllib.request.urlopen(f"{url}/status", timeout=10) as r:
        status = json.loads(r.read())
    return str(status["models"][BUILTIN_NAME]["settings"]["batch_by"])


def run_builtin(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The built-in model with classes, passes by tokens and by count: measured rows."""
    rows: list[dict[str, Any]] = []
    extra = ["--text-words", args.text_words]
    for by in BATCH_BY:
        flags = ["--max-batch-size", "32", "--max-wait", "2ms", "--batch-by", by]
        with batchserve([*flags, *builtin_classes(args.reserve)]) as served:
            in_force = batch_by_of(served.url)
            for scenario, streams in builtin_streams(args):
                for m in measure(served.url, streams, args.duration, BUILTIN_NAME, extra):
                    rows.append({"batch_by": in_force, "scenario": scenario, **m})
                time.sleep(0.5)  # the server's queue drains before the next run
    for row in rows:
        row["alone_p99_ms"] = next(
            r["p99_ms"]
            for r in rows
            if r["batch_by"] == row["batch_by"] and r["scenario"] == f"{row['class']} alone"
        )
    return rows


def builtin_summary(rows: list[dict[str, Any]]) -> list[str]:
    """Interactive p99 beside bulk's, alone and mixed, by tokens and by count side by side."""
    lines = []
    for by in BATCH_BY:
        mixed = {r["class"]: r for r in rows if r["batch_by"] == by and r["scenario"] == "mixed"}
        if not mixed:
            continue
        q, b = mixed["interactive"], mixed["bulk"]
        lines.append(
            f"by {by:6s}: interactive p99 {q['p99_ms']:.1f} ms (alone {q['alone_p99_ms']:.1f}),"
            f" bulk p99 {b['p99_ms']:.1f} ms (alone {b['alone_p99_ms']:.1f}); bulk "
            f"{b['ok_per_s']:.0f} texts/s; refused {q['rejected']} + {b['rejected']}, timed out "
            f"{q['timed_out']} + {b['timed_out']}"
        )
    return lines


def print_builtin(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The built-in model's table and its summary."""
    print(
        f"{BUILTIN_NAME} with classes interactive and bulk; {args.duration:g} s per run; "
        f"{args.text_words} words a text; rates in texts/s\n"
    )
    print(
        f"{'batch_by':9s}{'scenario':19s}{'stream':13s}"
        f"{'ok/s':>8s}{'p50':>9s}{'p99':>9s}{'alone p99':>10s}{'rej':>6s}{'t/o':>5s}"
    )
    for r in rows:
        print(
            f"{r['batch_by']:9s}{r['scenario']:19s}{r['class']:13s}{r['ok_per_s']:8.0f}"
            f"{r['p50_ms']:9.1f}{r['p99_ms']:9.1f}{r['alone_p99_ms']:10.1f}"
            f"{r['rejected']:6d}{r['timed_out']:5d}"
        )
    print()
    for line in builtin_summary(rows):
        print(line)


def fitted_pass_s(url: str) -> float:
    """What the server's own cost model says a full pass takes (from its /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    value = {}
    for name in ("batchserve_cost_fixed_seconds", "batchserve_cost_per_item_seconds"):
        match = re.search(rf"^{name}\{{model=\"m\"\}} (\S+)$", text, re.MULTILINE)
        assert match is not None, name
        value[name] = float(match.group(1))
    fixed = value["batchserve_cost_fixed_seconds"]
    return fixed + MAX_BATCH * value["batchserve_cost_per_item_seconds"]


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every policy and scenario: measured (unless --simulate-only) and predicted rows.

    The simulator is given the server's own overhead per pass (``--overhead``; by default
    what the server's cost model measured for a full pass after the bulk-alone run, minus
    the model's nominal cost), so that it predicts this machine, not an ideal one.
    """
    rows: list[dict[str, Any]] = []
    for policy in POLICIES:
        measured: dict[str, list[dict[str, Any] | None]] = {}
        overhead = args.overhead
        with contextlib.ExitStack() as stack:
            url = None if args.simulate_only else stack.enter_context(server(policy))
            for scenario, streams in SCENARIOS:
                if url is None:
                    measured[scenario] = [None] * len(streams)
                    continue
                measured[scenario] = list(measure(url, streams, args.duration))
                time.sleep(0.5)  # the server's queue drains before the next run
                if scenario == "bulk alone" and overhead is None:
                    overhead = max(0.0, fitted_pass_s(url) - COST.cost(MAX_BATCH))
        overhead = overhead or 0.0
        for scenario, streams in SCENARIOS:
            predicted = predict(policy, streams, args.duration, overhead)
            for p, m in zip(predicted, measured[scenario], strict=True):
                row: dict[str, Any] = {"policy": policy, "scenario": scenario}
                if m is not None:
                    row.update({k: m[k] for k in KEYS})
                else:
                    row.update({"class": p["class"], "tenant": p["tenant"]})
                row.update({f"predicted_{k}": p[k] for k in KEYS[2:]})
                row["sim_overhead_ms"] = overhead * 1e3
                if m is not None and p["ok_per_s"]:
                    row["ok_vs_predicted"] = m["ok_per_s"] / p["ok_per_s"]
                rows.append(row)
    _alone(rows)
    return rows


def _alone(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        for prefix in ("", "predicted_"):
            alone = next(
                (
                    r.get(f"{prefix}p99_ms")
                    for r in rows
                    if r["policy"] == row["policy"] and r["scenario"] == f"{row['class']} alone"
                ),
                None,
            )
            if alone is not None:
                row[f"{prefix}alone_p99_ms"] = alone


def summary(rows: list[dict[str, Any]], measured: bool) -> list[str]:
    """The headline figures, one line per policy (the classes policy, FIFO beside it)."""
    lines = []
    for prefix, label in (("", "measured"), ("predicted_", "simulated")):
        if prefix == "" and not measured:
            continue
        for policy in POLICIES:
            mixed = {
                r["class"]: r for r in rows if r["policy"] == policy and r["scenario"] == "mixed"
            }
            q, b = mixed["interactive"], mixed["bulk"]
            ratio = q[f"{prefix}p99_ms"] / q[f"{prefix}alone_p99_ms"]
            # The capacity: what this server gave bulk work alone, under the same policy.
            capacity = next(
                r[f"{prefix}ok_per_s"]
                for r in rows
                if r["policy"] == policy and r["scenario"] == "bulk alone"
            )
            left = capacity - q[f"{prefix}ok_per_s"]
            share = b[f"{prefix}ok_per_s"] / left
            tenants = [r for r in rows if r["policy"] == policy and r["scenario"] == "tenants"]
            total = sum(r[f"{prefix}ok_per_s"] for r in tenants)
            shares = ", ".join(
                f"{r['tenant']} {r[f'{prefix}ok_per_s'] / total:.0%}" for r in tenants
            )
            lines.append(
                f"{label:9s} {policy:7s}: interactive p99 {q[f'{prefix}p99_ms']:.1f} ms = "
                f"{ratio:.2f}x alone ({q[f'{prefix}alone_p99_ms']:.1f} ms), "
                f"{q[f'{prefix}rejected']} refused, {q[f'{prefix}timed_out']} timed out; bulk "
                f"{b[f'{prefix}ok_per_s']:.0f}/s = {share:.0%} of the {left:.0f}/s left; "
                f"tenants {shares}"
            )
    if measured:
        for policy in POLICIES:
            gaps = [
                (abs(r["ok_vs_predicted"] - 1), f"{r['scenario']} {r['class']}/{r['tenant']}")
                for r in rows
                if r["policy"] == policy and "ok_vs_predicted" in r
            ]
            worst, where = max(gaps)
            where = where.rstrip("/")
            lines.append(f"measured ok/s vs simulated, {policy}: worst gap {worst:.1%} ({where})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run (5)")
    parser.add_argument("--simulate-only", action="store_true", help="skip the measured runs")
    parser.add_argument(
        "--overhead",
        type=float,
        default=None,
        help="seconds the simulator adds to every pass for the server's own work (default: "
        "what the server measured; 0 with --simulate-only)",
    )
    parser.add_argument(
        "--builtin",
        action="store_true",
        help="the built-in model with classes, passes by tokens vs by count (measured only)",
    )
    parser.add_argument(
        "--interactive", type=float, default=10.0, help="--builtin: queries per second (10)"
    )
    parser.add_argument(
        "--bulk", type=float, default=2.0, help="--builtin: bulk requests per second (2)"
    )
    parser.add_argument(
        "--bulk-inputs", type=int, default=32, help="--builtin: texts per bulk request (32)"
    )
    parser.add_argument(
        "--text-words", default="3:200", help="--builtin: words per text, N or LOW:HIGH (3:200)"
    )
    parser.add_argument(
        "--reserve",
        type=int,
        default=1,
        help="--builtin: workers kept for the interactive class (1; 0: none kept)",
    )
    args = parser.parse_args()
    if args.builtin:
        rows = run_builtin(args)
        if args.json:
            for row in rows:
                print(json.dumps(row))
        else:
            print_builtin(rows, args)
        return
    rows = run(args)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    measured = not args.simulate_only
    print(
        f"model {COST.fixed_s * 1e3:g} ms + {COST.per_item_s * 1e3:g} ms/item, batch <= 64: "
        f"{CAPACITY:.0f} items/s; {args.duration:g} s per run; rates in items/s\n"
    )
    head = f"{'policy':8s}{'scenario':19s}{'stream':15s}"
    if measured:
        head += f"{'ok/s':>8s}{'p50':>8s}{'p99':>8s}{'rej':>6s}{'t/o':>5s}"
    head += f"{'sim ok/s':>9s}{'sim p50':>8s}{'sim p99':>8s}{'sim rej':>8s}"
    print(head)
    for r in rows:
        stream = r["class"] + (f"/{r['tenant']}" if r["tenant"] else "")
        line = f"{r['policy']:8s}{r['scenario']:19s}{stream:15s}"
        if measured:
            line += (
                f"{r['ok_per_s']:8.0f}{r['p50_ms']:8.1f}{r['p99_ms']:8.1f}"
                f"{r['rejected']:6d}{r['timed_out']:5d}"
            )
        line += (
            f"{r['predicted_ok_per_s']:9.0f}{r['predicted_p50_ms']:8.1f}"
            f"{r['predicted_p99_ms']:8.1f}{r['predicted_rejected']:8d}"
        )
        print(line)
    print()
    for line in summary(rows, measured):
        print(line)


if __name__ == "__main__":
    main()
