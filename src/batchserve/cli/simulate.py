"""``batchserve simulate``: the server's batching policy on virtual time.

Two modes. ``--backlog N`` is the deterministic seed's experiment: N requests waiting at time
0, served unbatched and then in passes of at most ``--max-batch-size``; it prints the seed's
three steps and verdict and exits 1 when batching does not raise throughput more than 2x.
Without ``--backlog`` it is an open-loop run (``--rate``, ``--duration``, ``--arrivals``)
with the server's settings, reporting what the load generator reports; ``--replicas N``
runs it on N replicas behind a load balancer (``--routing``), as
:func:`~batchserve.sim.simulate_fleet` does. The defaults are the
Go seed's scenario, so ``batchserve simulate`` predicts a row of ``batchserve demo``.
``--mix CLASS:rate=R,...`` (repeated) runs mixed traffic instead, one stream per class and
tenant, on the classes ``--class`` describes (none: today's single FIFO queue), and reports
each stream, as :func:`~batchserve.sim.mix.simulate_mix` does.
``--tokens N|LOW:HIGH`` sizes every request (tokens drawn uniformly, seeded by ``--seed``) for
a model that pads a forward call to its longest item. By default its pass runs as the
engines run one, length-sorted sub-passes (:mod:`batchserve.subpasses`), each costing
``--subpass-fixed`` plus ``--per-token`` per padded token plus ``--attention`` per padded
token per token of its length (what ``batchserve profile`` measures of an engine's
sub-passes); with ``--padded``, one call padded whole (``--per-token`` x longest x count).
Either is on top of ``--fixed``/``--per-item`` per pass. ``--batch-by`` and
``--max-batch-tokens`` are the server's flags.
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

from batchserve.cli._common import (
    HelpFormatter,
    add_cost_args,
    add_queue_args,
    duration,
    falls_back,
    int_range,
    positive_int,
)
from batchserve.cli.classes import add_class_args, classes_from_args
from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import ConfigError
from batchserve.models.profiling import load_profile
from batchserve.policy import ClassConfig
from batchserve.sim import (
    ROUTINGS,
    FleetResult,
    SimResult,
    simulate,
    simulate_backlog,
    simulate_fleet,
)
from batchserve.sim.mix import MixResult, parse_stream, simulate_mix
from batchserve.subpasses import PassCost
from batchserve.units import format_duration
from batchserve.workload.arrivals import ARRIVAL_MODES, arrival_times
from batchserve.workload.seed import (
    SEED_DURATION_S,
    SEED_RATE,
)
from batchserve.workload.summary import batch_label

__all__ = [
    "add_batch_args",
    "add_parser",
    "cost_from_args",
    "initial_cost_from_args",
    "subpass_from_args",
]


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """The open-loop scenario and server flags of ``simulate``."""
    g = p.add_argument_group("load (open loop)")
    g.add_argument("--rate", type=float, default=SEED_RATE, help="requests per second")
    g.add_argument(
        "--duration",
        type=duration,
        default=format_duration(SEED_DURATION_S),
        help="schedule length (%(default)s)",
    )
    g.add_argument("--arrivals", choices=ARRIVAL_MODES, default="constant", help="arrival process")
    g.add_argument("--seed", type=int, default=0, help="random seed for poisson arrivals")
    s = p.add_argument_group("server settings, as `serve` takes them")
    add_queue_args(s)
    s.add_argument("--max-batch-size", type=positive_int, default=32, help="(%(default)s)")
    s.add_argument("--max-wait", type=duration, default="2ms", help="(%(default)s)")
    s.add_argument("--workers", type=positive_int, default=1, help="(%(default)s)")
    t = p.add_argument_group("a padded model: tokens per request (one open-loop server only)")
    t.add_argument(
        "--tokens",
        type=int_range,
        metavar="N|LOW:HIGH",
        help="each request's tokens, drawn uniformly from LOW:HIGH (none: not sized)",
    )
    t.add_argument(
        "--per-token",
        type=duration,
        default="0s",
        help="cost of each padded token of a sub-pass (of the pass, with --padded), on top "
        "of --fixed/--per-item (%(default)s)",
    )
    t.add_argument(
        "--subpass-fixed",
        type=duration,
        default="0s",
        help="fixed cost of each length-sorted sub-pass of a pass (%(default)s)",
    )
    t.add_argument(
        "--attention",
        type=duration,
        default="0s",
        help="cost of each padded token of a sub-pass per token of its length (%(default)s)",
    )
    t.add_argument(
        "--padded",
        action="store_true",
        help="a model that runs a pass as one call padded to its longest item, not as "
        "length-sorted sub-passes",
    )
    t.add_argument(
        "--batch-by",
        choices=("auto", "count", "tokens"),
        default="auto",
        help="as `serve --batch-by` (auto: tokens when --tokens is given)",
    )
    t.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        help="as `serve --max-batch-tokens`: padded tokens a pass holds at most",
    )


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    """The fleet flags: ``--replicas``, ``--routing``, ``--max-tries``."""
    g = p.add_argument_group("fleet: replicas behind a load balancer")
    falls_back(
        g.add_argument(
            "--replicas",
            type=positive_int,
            help="replicas, each with these settings, behind a load balancer",
        ),
        "one server, no balancer",
    )
    g.add_argument(
        "--routing",
        choices=ROUTINGS,
        default="least_conn",
        help="how the balancer picks a replica (deploy/nginx: least_conn)",
    )
    falls_back(
        g.add_argument(
            "--max-tries",
            type=positive_int,
            help="replicas tried per request when they refuse",
        ),
        "all of them",
    )


def cost_from_args(args: argparse.Namespace) -> CostEstimate:
    """The true cost of a pass: from ``--profile`` if given, else ``--fixed``/``--per-item``."""
    if args.profile:
        return load_profile(args.profile)
    return CostEstimate(fixed_s=args.fixed, per_item_s=args.per_item)


def initial_cost_from_args(args: argparse.Namespace, cost: CostEstimate) -> CostEstimate:
    """Where the simulated server's cost model starts: as the real server would."""
    if args.profile or args.warm_start:
        return cost
    return CostEstimate(fixed_s=0.0, per_item_s=0.0)


def add_parser(sub: Any) -> None:
    """Register the ``simulate`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="predict the server's behaviour on virtual time",
        description="Drive the server's batching policy on virtual time with a cost model "
        "fixed + n * per_item. --backlog N runs the deterministic seed's experiment; "
        "otherwise an open-loop load runs (defaults: the Go seed's scenario). The same "
        "arguments always print the same bytes.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--backlog",
        type=positive_int,
        metavar="N",
        help="N requests waiting at time 0, served unbatched then in passes of at most "
        "--max-batch-size; exit 1 unless batching raises throughput more than 2x",
    )
    add_batch_args(p)
    p.add_argument(
        "--mix",
        action="append",
        metavar="CLASS:rate=R[,inputs=N,timeout=T,tenant=NAME,arrivals=A,seed=S]",
        help="mixed traffic: one stream of requests of a class (and tenant) per --mix, "
        "each of N inputs (repeat); with --class the classes policy runs, without it one "
        "FIFO queue (a stream's deadline: its timeout=, its class's, else --timeout)",
    )
    add_class_args(p)
    add_fleet_args(p)
    add_cost_args(p)
    p.add_argument("--name", help="the row's label")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the simulation and print its report."""
    cost = cost_from_args(args)
    if args.backlog is not None:
        backlog = simulate_backlog(
            requests=args.backlog,
            max_batch_size=args.max_batch_size,
            cost=cost,
            workers=args.workers,
            overhead_s=args.overhead,
        )
        print(json.dumps(backlog.to_dict()) if args.json else backlog.format())
        return 0 if backlog.ok else 1
    if args.rate <= 0:
        raise ValueError(f"--rate must be > 0, got {args.rate}")
    duration_s = args.duration
    mode = args.arrivals
    config = BatchConfig(
        max_batch_size=args.max_batch_size,
        max_wait_s=args.max_wait,
        queue_size=args.queue_size,
        workers=args.workers,
        admission=args.admission,
        prefetch=args.prefetch,
        initial_cost=initial_cost_from_args(args, cost),
        batch_by=args.batch_by,
        max_batch_tokens=args.max_batch_tokens,
    )
    _check_token_flags(args)
    classes = classes_from_args(args)
    if args.mix:
        return _run_mix(args, config, cost, classes)
    if classes is not None:
        raise ConfigError("--class needs --mix (the traffic of each class)")
    schedule = arrival_times(rate=args.rate, duration_s=duration_s, arrivals=mode, seed=args.seed)
    if args.replicas is not None:
        return _run_fleet(args, config, cost, schedule)
    sizes = None
    if args.tokens is not None:
        rng = random.Random(args.seed)
        low, high = args.tokens
        sizes = [rng.randint(low, high) for _ in schedule]
    result = simulate(
        config=config,
        cost=cost,
        arrivals=schedule,
        timeout_s=args.timeout,
        duration_s=duration_s,
        overhead_s=args.overhead,
        name=args.name or batch_label(args.max_batch_size, args.max_wait, args.workers),
        sizes=sizes,
        per_token_s=args.per_token if args.padded else 0.0,
        subpass=subpass_from_args(args) if sizes is not None else None,
    )
    scenario = _scenario(args, cost)
    if args.json:
        print(json.dumps({**result.to_dict(), **scenario}))
        return 0
    print(_header(scenario, duration_s))
    print()
    print(result.summary.format_row())
    print(_details(result))
    return 0


def subpass_from_args(args: argparse.Namespace) -> PassCost | None:
    """The true cost of a sub-pass (None with ``--padded``, or when it costs nothing)."""
    if args.padded:
        return None
    cost = PassCost(
        fixed_s=args.subpass_fixed, per_token_s=args.per_token, attention_s=args.attention
    )
    return cost if cost.fixed_s or cost.per_token_s or cost.attention_s else None


def _check_token_flags(args: argparse.Namespace) -> None:
    # Every token flag needs --tokens (the requests' sizes) and one open-loop server.
    if args.padded and (args.subpass_fixed or args.attention):
        flag = "--subpass-fixed" if args.subpass_fixed else "--attention"
        raise ConfigError(f"{flag} is a sub-pass's cost: not with --padded (one padded call)")
    given = [
        flag
        for flag, on in (
            ("--per-token", bool(args.per_token)),
            ("--subpass-fixed", bool(args.subpass_fixed)),
            ("--attention", bool(args.attention)),
            ("--padded", args.padded),
            ("--max-batch-tokens", args.max_batch_tokens is not None),
            ("--batch-by tokens", args.batch_by == "tokens"),
        )
        if on
    ]
    if args.tokens is not None:
        given.insert(0, "--tokens")
    elif given:
        raise ConfigError(f"{given[0]} needs --tokens (each request's tokens)")
    if given and (args.replicas is not None or args.mix):
        raise ConfigError(f"{given[0]} needs one server: not with --replicas or --mix")


def _scenario(args: argparse.Namespace, cost: CostEstimate) -> dict[str, Any]:
    return {
        "mode": "open_loop",
        "rate": args.rate,
        "arrivals": args.arrivals,
        "seed": args.seed,
        "timeout_s": args.timeout,
        "queue_size": args.queue_size,
        "workers": args.workers,
        "admission": args.admission,
        "prefetch": args.prefetch,
        "fixed_s": cost.fixed_s,
        "per_item_s": cost.per_item_s,
        "overhead_s": args.overhead,
        "tokens": args.tokens,
        "per_token_s": args.per_token,
        "subpass_fixed_s": args.subpass_fixed,
        "attention_s": args.attention,
        "pass_shape": "padded" if args.padded else "sorted",
        "batch_by": args.batch_by,
    }


def _run_fleet(
    args: argparse.Namespace, config: BatchConfig, cost: CostEstimate, schedule: list[float]
) -> int:
    name = args.name or batch_label(args.max_batch_size, args.max_wait, args.workers)
    result = simulate_fleet(
        replicas=args.replicas,
        routing=args.routing,
        config=config,
        cost=cost,
        arrivals=schedule,
        timeout_s=args.timeout,
        duration_s=args.duration,
        overhead_s=args.overhead,
        max_tries=args.max_tries,
        seed=args.seed,
        name=f"{args.replicas} x {name}",
    )
    scenario = _scenario(args, cost)
    if args.json:
        print(json.dumps({**result.to_dict(), **scenario, "max_tries": args.max_tries}))
        return 0
    tries = "every replica" if args.max_tries is None else f"up to {args.max_tries} replicas"
    print(_header(scenario, args.duration))
    print(f"fleet: {args.replicas} replicas, routing {args.routing}, a refusal retried on {tries}")
    print()
    print(result.summary.format_row())
    print(_fleet_details(result))
    return 0


def _run_mix(
    args: argparse.Namespace,
    config: BatchConfig,
    cost: CostEstimate,
    classes: ClassConfig | None,
) -> int:
    result = simulate_mix(
        config=config,
        cost=cost,
        streams=[parse_stream(text) for text in args.mix],
        duration_s=args.duration,
        classes=classes,
        timeout_s=args.timeout,
        overhead_s=args.overhead,
    )
    if args.json:
        print(json.dumps(result.to_dicts()))
        return 0
    print(_mix_table(result, cost, args.duration))
    return 0


def _mix_table(result: MixResult, cost: CostEstimate, duration_s: float) -> str:
    lines = [
        f"simulated: {format_duration(cost.fixed_s)} per call + "
        f"{format_duration(cost.per_item_s)} per item, policy {result.policy}, "
        f"{format_duration(duration_s)}; rates in items per second",
        "",
        f"{'stream':<24}{'offered/s':>10}{'ok/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'rejected':>10}{'timed out':>10}",
    ]
    for f in result.streams:
        lines.append(
            f"{f.stream.label:<24}{f.offered_per_s:>10.1f}{f.ok_per_s:>10.1f}{f.p50_ms:>9.1f}"
            f"{f.p99_ms:>9.1f}{f.rejected_total:>10}{f.timed_out:>10}"
        )
    lines.append(f"  {result.batches} passes, {result.items} items")
    return "\n".join(lines)


def _fleet_details(result: FleetResult) -> str:
    s = result.summary
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(s.rejected_by_reason.items())) or "none"
    oks = [r.ok for r in result.per_replica]
    return (
        f"  sent {s.sent}, ok {s.ok}, late {result.late}, expired {result.expired}, "
        f"rejected by every replica tried {s.rejected} ({reasons}), retried {result.retries}; "
        f"{result.batches} passes, last answer at {result.end_s:.4f}s of virtual time\n"
        f"  ok per replica: min {min(oks)}, max {max(oks)}"
    )


def _header(sc: dict[str, Any], duration_s: float) -> str:
    deadline = "none" if sc["timeout_s"] is None else format_duration(sc["timeout_s"])
    seed = f", seed {sc['seed']}" if sc["arrivals"] == "poisson" else ""
    overhead = f" + {format_duration(sc['overhead_s'])} overhead" if sc["overhead_s"] else ""
    tokens = sc.get("tokens")
    if tokens is not None:
        per_token = format_duration(sc["per_token_s"])
        each = f"{tokens[0]}-{tokens[1]} tokens each"
        if sc["pass_shape"] == "padded":
            overhead += f" + {per_token} per padded token, padded whole ({each})"
        else:
            overhead += (
                f" + length-sorted sub-passes of {format_duration(sc['subpass_fixed_s'])} + "
                f"{per_token} per padded token + {format_duration(sc['attention_s'])} per "
                f"token x length ({each})"
            )
    return (
        f"simulated: {format_duration(sc['fixed_s'])} per call + "
        f"{format_duration(sc['per_item_s'])} per item{overhead}. Offered load: {sc['rate']:g} "
        f"requests/s ({sc['arrivals']}{seed}) for {format_duration(duration_s)}, "
        f"deadline {deadline}, queue {sc['queue_size']}, "
        f"admission {'on' if sc['admission'] else 'off'}"
    )


def _details(result: SimResult) -> str:
    s = result.summary
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(s.rejected_by_reason.items())) or "none"
    out = (
        f"  sent {s.sent}, ok {s.ok}, late {result.late}, expired {result.expired}, "
        f"rejected {s.rejected} ({reasons}); {result.batches} passes, last answer at "
        f"{result.end_s:.4f}s of virtual time"
    )
    tokens = result.stats.tokens
    if tokens is not None:
        out += (
            f"\n  passes by tokens: {tokens.padded} padded tokens for {tokens.real} real "
            f"(padding waste {tokens.waste:.2f}x)"
        )
    return out
