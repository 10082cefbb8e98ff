"""``batchserve demo``: the Go seed's experiment, in-process, on this engine."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from typing import Any

from batchserve.cli._common import HelpFormatter, duration, positive_int
from batchserve.loadgen.inprocess import run_seed_demo
from batchserve.sim.seed import predict_seed_demo
from batchserve.workload.seed import (
    SEED_DURATION_S,
    SEED_FIXED_S,
    SEED_PER_ITEM_S,
    SEED_QUEUE,
    SEED_RATE,
    SEED_TIMEOUT_S,
)
from batchserve.workload.summary import LoadSummary

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the ``demo`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="reproduce the Go seed's batching experiment in-process",
        description="Open-loop load on the seed's synthetic model under four batching "
        "configurations, then what this engine adds.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--rate", type=float, default=SEED_RATE, help="requests per second")
    p.add_argument("--duration", type=duration, default=SEED_DURATION_S, help="e.g. 1.5s")
    p.add_argument("--timeout", type=duration, default=SEED_TIMEOUT_S, help="per caller")
    p.add_argument("--queue-size", type=positive_int, default=SEED_QUEUE)
    p.add_argument("--fixed", type=duration, default=SEED_FIXED_S, help="model cost per call")
    p.add_argument("--per-item", type=duration, default=SEED_PER_ITEM_S, help="cost per item")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.set_defaults(run=run)


#: The simulator's figures added to each JSON row, as ``predicted_<key>``.
_PREDICTED_KEYS = ("ok_per_s", "avg_batch", "p50_ms", "p99_ms", "rejected", "timed_out")


def _json_row(row: LoadSummary, predicted: LoadSummary | None = None) -> dict[str, Any]:
    out = row.to_dict()
    if predicted is not None:
        guess = predicted.to_dict()
        out.update({f"predicted_{k}": guess[k] for k in _PREDICTED_KEYS})
    return out


def run(args: argparse.Namespace) -> int:
    """Run the demo and print its table (or JSON lines)."""
    if args.rate <= 0:
        raise ValueError(f"--rate must be > 0, got {args.rate}")
    if not args.json:
        print(
            f"model: {args.fixed * 1e3:g}ms per call + {args.per_item * 1e3:g}ms per item. "
            f"Offered load: {args.rate:g} requests/s for {args.duration:g}s, "
            f"deadline {args.timeout * 1e3:g}ms, queue {args.queue_size}\n"
        )
    scenario = {
        "rate": args.rate,
        "duration_s": args.duration,
        "timeout_s": args.timeout,
        "queue_size": args.queue_size,
        "fixed_s": args.fixed,
        "per_item_s": args.per_item,
    }
    rows = asyncio.run(run_seed_demo(**scenario))
    predictions = predict_seed_demo(**scenario)
    for i, (row, predicted) in enumerate(zip(rows, predictions, strict=True)):
        if args.json:
            print(json.dumps(_json_row(row, predicted)))
            continue
        if i == 4:
            print("\nWhat this engine adds: the same rows without deadline-aware admission")
        print(row.format_row())
        print(replace(predicted, name="  predicted (simulator)").format_row())
    if not args.json:
        print(
            "\npredicted: the same settings and schedule on the simulator, the server with "
            "no overhead of its own (batchserve simulate)"
        )
    return 0
