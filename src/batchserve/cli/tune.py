"""``batchserve tune``: the batching settings that serve the most within a p99 target.

Searches max batch size, max wait and workers on the simulator (:mod:`batchserve.sim.tuning`)
for an offered rate, or each rate of a range, and prints the best setting as ``serve``
flags with the predicted table of the best few. When no setting meets the target it says
so, and which rate could be met. With ``--max-replicas N`` it sizes a fleet instead: the
fewest replicas (up to N) behind a ``--routing`` balancer, and their setting, that serve the
rate within the target (:mod:`batchserve.sim.sizing`). Exits 1 when the target is not met (at
any rate given).

With ``--mix`` (streams of several classes, as ``simulate --mix``), ``--class`` and one
``--target CLASS=P99`` per class that has a latency target, it searches max batch size and
max wait for the most items served with every target class within its p99
(:func:`~batchserve.sim.mixtune.tune_mix`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from batchserve.cli._common import (
    HelpFormatter,
    add_cost_args,
    add_queue_args,
    duration,
    positive_int,
    rates,
)
from batchserve.cli.classes import add_class_args, classes_from_args
from batchserve.cli.simulate import cost_from_args, initial_cost_from_args
from batchserve.config import BatchConfig, check_positive
from batchserve.errors import ConfigError
from batchserve.sim import ROUTINGS
from batchserve.sim.mix import parse_stream
from batchserve.sim.mixtune import MixTuneResult, tune_mix
from batchserve.sim.sizing import FleetPlan, size_fleet
from batchserve.sim.tuning import Evaluation, Scenario, TuneResult, tune
from batchserve.units import format_duration, parse_duration

__all__ = ["add_parser"]


def _share(text: str) -> float:
    value = text.strip()
    try:
        share = float(value[:-1]) / 100.0 if value.endswith("%") else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a share such as 1% or 0.01, got {text!r}"
        ) from None
    if not 0.0 <= share < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0%, 100%), got {text!r}")
    return share


def add_parser(sub: Any) -> None:
    """Register the ``tune`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "tune",
        help="search batch size, max wait and workers for the most goodput within a p99",
        description="Search max batch size, max wait and workers on the simulator for the "
        "setting that serves the most requests with p99 latency within the target, at an "
        "offered rate (or each of a range). Exits 1 when the target cannot be met.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--rate",
        type=rates,
        help="requests per second: 600, 200,400,600 or 200:1000:200 (required without --mix)",
    )
    p.add_argument(
        "--p99", type=duration, help="p99 latency target, e.g. 50ms (required without --mix)"
    )
    m = p.add_argument_group("mixed traffic: per-class targets")
    m.add_argument(
        "--mix",
        action="append",
        metavar="CLASS:rate=R[,inputs=N,timeout=T,tenant=NAME,arrivals=A,seed=S]",
        help="a stream of the mix (repeat), as `simulate --mix`; needs --class and --target",
    )
    m.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="CLASS=P99",
        help="a class's p99 target (repeat), e.g. interactive=80ms",
    )
    m.add_argument(
        "--duration",
        type=duration,
        default="3s",
        help="simulated schedule per setting (%(default)s)",
    )
    add_class_args(p)
    add_queue_args(p)
    p.add_argument("--max-workers", type=positive_int, default=4, help="search 1..N (%(default)s)")
    p.add_argument(
        "--max-batch-limit",
        type=positive_int,
        default=256,
        help="largest batch searched (%(default)s)",
    )
    p.add_argument(
        "--max-loss",
        type=_share,
        default=0.01,
        help="share of requests that may go unserved while meeting the target (1%%)",
    )
    p.add_argument("--top", type=positive_int, default=5, help="rows in the table (%(default)s)")
    p.add_argument(
        "--max-replicas",
        type=positive_int,
        metavar="N",
        help="size a fleet: the fewest replicas (up to N) that serve --rate within --p99",
    )
    p.add_argument(
        "--routing",
        choices=ROUTINGS,
        default="least_conn",
        help="the fleet's balancer, with --max-replicas (least_conn, as deploy/nginx does)",
    )
    add_cost_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object per rate")
    p.set_defaults(run=run)


def _targets(texts: list[str]) -> dict[str, float]:
    out = {}
    for text in texts:
        name, eq, value = text.partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"--target must be CLASS=P99 such as interactive=80ms, got {text!r}")
        out[name.strip()] = check_positive(
            f"--target {name.strip()}",
            parse_duration(value.strip(), name=f"--target {name.strip()}"),
        )
    return out


def _run_mix(args: argparse.Namespace) -> int:
    classes = classes_from_args(args)
    if classes is None:
        raise ConfigError("--mix needs --class (the classes the server is given)")
    cost = cost_from_args(args)
    result = tune_mix(
        config=BatchConfig(
            queue_size=args.queue_size,
            admission=args.admission,
            prefetch=args.prefetch,
            initial_cost=initial_cost_from_args(args, cost),
        ),
        cost=cost,
        streams=[parse_stream(t) for t in args.mix],
        classes=classes,
        targets_s=_targets(args.target),
        duration_s=args.duration,
        max_loss=args.max_loss,
        max_batch_size=args.max_batch_limit,
        overhead_s=args.overhead,
        timeout_s=args.timeout,
    )
    if args.json:
        best = result.best
        print(
            json.dumps(
                {
                    "met": result.met,
                    "targets_s": result.targets_s,
                    "best": None if best is None else best.to_dict(),
                    "ranked": [e.to_dict() for e in result.ranked[: args.top]],
                }
            )
        )
    else:
        print(_format_mix(result, args.top))
    return 0 if result.met else 1


def _format_mix(result: MixTuneResult, top: int) -> str:
    targets = ", ".join(f"{k} p99 <= {format_duration(v)}" for k, v in result.targets_s.items())
    lines = [f"targets: {targets}", ""]
    best = result.best
    if best is None:
        closest = result.ranked[0]
        lines.append(
            f"no setting meets the targets; the closest (batch <= {closest.max_batch_size}, "
            f"wait {format_duration(closest.max_wait_s)}) has a p99 {closest.worst:.2f}x its "
            "target"
        )
    else:
        lines.append(
            f"best: --max-batch-size {best.max_batch_size} --max-wait "
            f"{format_duration(best.max_wait_s)} ({best.ok_per_s:.0f} items/s served)"
        )
    lines.append("")
    lines.append(f"{'batch':>6}{'wait':>8}{'ok items/s':>12}  p99 ms by class (loss)")
    for e in result.ranked[:top]:
        figures = ", ".join(
            f"{k} {e.p99_ms.get(k, 0.0):.1f} ({e.loss[k]:.1%})" for k in result.targets_s
        )
        mark = "" if e.met else "  misses"
        lines.append(
            f"{e.max_batch_size:>6}{format_duration(e.max_wait_s):>8}{e.ok_per_s:>12.0f}  "
            f"{figures}{mark}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Tune for each rate and print the findings."""
    if args.mix:
        return _run_mix(args)
    if args.rate is None or args.p99 is None:
        raise ConfigError("tune needs --rate and --p99 (or --mix with --target)")
    cost = cost_from_args(args)
    status = 0
    for i, rate in enumerate(args.rate):
        scenario = Scenario(
            rate=rate,
            p99_target_s=args.p99,
            cost=cost,
            timeout_s=args.timeout,
            queue_size=args.queue_size,
            admission=args.admission,
            prefetch=args.prefetch,
            initial_cost=initial_cost_from_args(args, cost),
            max_loss=args.max_loss,
            overhead_s=args.overhead,
        )
        if args.max_replicas is not None:
            plan = size_fleet(
                scenario,
                routing=args.routing,
                max_replicas=args.max_replicas,
                max_workers=args.max_workers,
                max_batch_size=args.max_batch_limit,
            )
            if not plan.met:
                status = 1
            if i and not args.json:
                print()
            print(json.dumps(plan.to_dict()) if args.json else format_plan(plan))
            continue
        result = tune(scenario, max_workers=args.max_workers, max_batch_size=args.max_batch_limit)
        if not result.met:
            status = 1
        if args.json:
            print(json.dumps(result.to_dict()))
        else:
            if i:
                print()
            print(format_result(result, top=args.top))
    return status


def format_result(result: TuneResult, *, top: int = 5) -> str:
    """The findings in words, then the predicted table of the best few settings."""
    sc = result.scenario
    target = format_duration(sc.p99_target_s)
    deadline = "none" if sc.timeout_s is None else format_duration(sc.timeout_s)
    lines = [
        f"tuning for {sc.rate:g} requests/s with p99 <= {target}: "
        f"{format_duration(sc.cost.fixed_s)} per call + {format_duration(sc.cost.per_item_s)} "
        f"per item, deadline {deadline}, queue {sc.queue_size}, "
        f"admission {'on' if sc.admission else 'off'}",
    ]
    if result.searched == 0:
        one = sc.cost.fixed_s + sc.cost.per_item_s + sc.overhead_s
        lines.append(
            f"no setting can meet p99 <= {target}: one pass of one item takes "
            f"{format_duration(one)}"
        )
        return "\n".join(lines)
    runs = result.ranked[0].runs if result.ranked else 0
    lines.append(
        f"searched {result.searched} settings on the simulator; the best "
        f"{len(result.ranked)} confirmed on {runs} schedules"
    )
    lines.append("")
    best = result.best
    if best is not None and result.met:
        lines.append(f"best: {best.setting.label()}")
        lines.append(f"  batchserve serve {sc.serve_flags(best.setting)} ...")
        lines.append(
            f"  meets the target: p99 {best.p99_ms:.1f} ms, serves {best.served * 100:.1f}% "
            f"of the offered load"
        )
    else:
        lines.append(
            f"no setting meets p99 <= {target} while serving {(1 - sc.max_loss) * 100:g}% of "
            f"{sc.rate:g} requests/s"
        )
        if best is not None:
            lines.append(
                f"  the most served within the target: {best.setting.label()} serves "
                f"{best.served * 100:.1f}% (p99 {best.p99_ms:.1f} ms)"
            )
        if result.max_rate is not None:
            lines.append(
                f"  the highest rate that can be met: about {result.max_rate:.0f} requests/s"
            )
    if best is not None and best.setting.workers > 1:
        lines.append(
            "  note: with several workers the simulator assumes passes do not slow each other "
            "(true of the synthetic model); for a model that fills its device, use "
            "--max-workers 1"
        )
    lines += ["", _header()]
    lines += [_row(e) for e in result.ranked[:top]]
    return "\n".join(lines)


def format_plan(plan: FleetPlan) -> str:
    """A fleet plan in words: the counts checked, then the answer and its predicted row."""
    sc = plan.scenario
    target = format_duration(sc.p99_target_s)
    lines = [
        f"sizing a fleet for {sc.rate:g} requests/s with p99 <= {target}: "
        f"{format_duration(sc.cost.fixed_s)} per call + {format_duration(sc.cost.per_item_s)} "
        f"per item, routing {plan.routing}, at most {plan.max_replicas} replicas",
    ]
    for c in plan.checked:
        ev = c.evaluation
        if ev is None:
            how = "no setting meets the target at a replica's share of the rate"
        else:
            how = f"{ev.setting.label()}: serves {ev.served * 100:.1f}%, p99 {ev.p99_ms:.1f} ms"
        lines.append(f"  {c.replicas:>5} replicas: {'meets' if c.meets else 'no   '}  {how}")
    lines.append("")
    best = plan.best
    if plan.replicas is None or best is None:
        lines.append(
            f"no fleet of up to {plan.max_replicas} replicas meets p99 <= {target} while "
            f"serving {(1 - sc.max_loss) * 100:g}% of {sc.rate:g} requests/s"
        )
        return "\n".join(lines)
    lines.append(f"needs {plan.replicas} replicas, each: {best.setting.label()}")
    lines.append(f"  batchserve serve {sc.serve_flags(best.setting)} ...   (on each replica)")
    lines.append(
        f"  predicted for the fleet: {best.ok_per_s:.0f} ok/s, serves {best.served * 100:.1f}%, "
        f"p50 {best.p50_ms:.1f} ms, p99 {best.p99_ms:.1f} ms, batch {best.avg_batch:.1f}"
    )
    return "\n".join(lines)


def _header() -> str:
    return (
        f"  {'setting':<34} {'ok/s':>6} {'served':>7} {'batch':>6} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'rejected':>8} {'timed out':>9}"
    )


def _row(e: Evaluation) -> str:
    mark = "" if e.feasible else "  (over target)"
    return (
        f"  {e.setting.label():<34} {e.ok_per_s:6.0f} {e.served * 100:6.1f}% {e.avg_batch:6.1f} "
        f"{e.p50_ms:7.1f} {e.p99_ms:7.1f} {e.rejected * 100:7.1f}% {e.timed_out * 100:8.1f}%"
        f"{mark}"
    )
