"""The command line: run the scenarios (the default), rebuild a report, check the servers.

``python bench/peers/compare.py [FLAGS]`` runs the scenarios and writes the report;
``python bench/peers/compare.py report RAW [RESULTS]`` rebuilds the report from a run's raw
figures; ``python bench/peers/compare.py servers [SERVER ...]`` starts, probes and stops
each server (a manual check).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import comparison
from comparison.cells import Bench, Plan, loadavg
from comparison.generator import write_texts
from comparison.real import IN_PROCESS, REAL_SERVERS, RealPlan
from comparison.report import versions, write_results
from comparison.scenarios import RUNNERS, SCENARIOS
from comparison.servers import (
    BENCH,
    PEERS,
    REAL_MODELS_ONLY,
    ROOT,
    SERVERS,
    Knobs,
    ModelSpec,
    available,
    describe,
    start,
)

__all__ = ["main"]

PROG = "bench/peers/compare.py"


def main(argv: list[str] | None = None) -> int:
    """The program: ``report`` and ``servers`` as a first word, else a run's flags."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["report"]:
        return report_main(args[1:])
    if args[:1] == ["servers"]:
        return servers_main(args[1:])
    return run_main(args)


def run_main(argv: list[str]) -> int:
    """Run the scenarios, write the raw figures and the report."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description=comparison.__doc__.splitlines()[0] if comparison.__doc__ else None,
        epilog=f"Also: {PROG} report RAW [RESULTS] (rebuild a report); "
        f"{PROG} servers [SERVER ...] (start, probe and stop each server).",
    )
    p.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated, of {', '.join(SCENARIOS)}",
    )
    p.add_argument(
        "--servers", default=",".join(SERVERS), help=f"comma-separated, of {', '.join(SERVERS)}"
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="runs per cell (default 2; 1 with --quick)"
    )
    p.add_argument(
        "--batchserve-flags",
        default="",
        help="more flags for every batchserve server, e.g. '--prefetch off' (an A/B run)",
    )
    real = p.add_argument_group("the real scenario (comparison/real.py)")
    contenders = (*IN_PROCESS, *REAL_SERVERS)
    real.add_argument(
        "--real-contenders",
        default=",".join(contenders),
        help=f"comma-separated, of {', '.join(contenders)} (baseline only with --baseline-src)",
    )
    real.add_argument(
        "--real-seconds",
        type=float,
        default=None,
        help="each measured run (default 20; 4 with --quick)",
    )
    real.add_argument("--real-per-request", type=int, default=32, help="texts per batch request")
    real.add_argument(
        "--real-connections", type=int, default=2, help="kept-alive connections, batch shape"
    )
    real.add_argument(
        "--real-overload",
        type=float,
        default=2.0,
        help="one text per request: rate offered past saturation, x the batch shape's texts/s",
    )
    real.add_argument(
        "--real-half-rate",
        type=float,
        default=0.0,
        metavar="PER_S",
        help="one text per request: the rate of the run at half capacity, the same for all "
        "(default: half of each contender's own goodput past saturation)",
    )
    real.add_argument(
        "--infinity-batches",
        default="8,16,32,64",
        help="Infinity's --batch-size values tried (the best kept; default 8,16,32,64)",
    )
    real.add_argument(
        "--fastembed-batches", default="8,16,32", help="fastembed's batch_size values tried"
    )
    real.add_argument(
        "--real-json",
        action="store_true",
        help="also print one JSON object per contender (for bench/tools/record.py compare_real)",
    )
    real.add_argument(
        "--baseline-src",
        default="",
        metavar="DIR",
        help="also run batchserve from this source tree (PYTHONPATH=DIR), e.g. "
        "/tmp/baseline/src: before and after in one run",
    )
    real.add_argument(
        "--baseline-cache",
        default=str(BENCH / "out" / "baseline-cache"),
        metavar="DIR",
        help="the baseline's BATCHSERVE_CACHE_DIR (its own verdict and exports)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: short runs, seed scenario only unless --scenarios is given",
    )
    p.add_argument(
        "--results",
        default=None,
        help="where to write the report ('' for nowhere; default bench/RESULTS.md, or "
        "bench/out/RESULTS-quick.md with --quick, so a smoke run never replaces a full one)",
    )
    args = p.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    if args.quick and args.scenarios == p.get_default("scenarios"):
        scenarios = ["seed"]
    servers = [s for s in args.servers.split(",") if s]
    for name, given, known in (
        ("--scenarios", scenarios, SCENARIOS),
        ("--servers", servers, SERVERS),
    ):
        bad = sorted(set(given) - set(known))
        if bad:
            p.error(f"{name}: unknown {bad}; known: {', '.join(known)}")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    real_contenders = [c for c in args.real_contenders.split(",") if c]
    bad = sorted(set(real_contenders) - set(contenders))
    if bad:
        p.error(f"--real-contenders: unknown {bad}; known: {', '.join(contenders)}")
    real_plan = _real_plan(p, args)
    missing = [s for s in servers if s in PEERS and available(s)]
    if missing and set(scenarios) - {"real"}:  # the real scenario has its own contenders
        print(
            f"peers without an environment (run bench/peers/setup.py): {missing}", file=sys.stderr
        )
    plan = Plan.make(quick=args.quick, repeats=args.repeats)
    if args.real_seconds is None:
        real_plan = dataclasses.replace(real_plan, seconds=plan.real_s)
    else:
        plan = dataclasses.replace(plan, real_s=args.real_seconds)
    # SIGTERM unwinds like Ctrl-C, so that every started server is stopped on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = BENCH / "out"
    bench = Bench(plan, servers, out_dir / "logs" / stamp)
    bench.batchserve_flags = tuple(args.batchserve_flags.split())
    bench.real, bench.real_contenders = real_plan, real_contenders
    bench.real_json = args.real_json
    write_texts()
    started = time.time()
    load_before = loadavg()
    for scenario in scenarios:
        RUNNERS[scenario](bench)
    data = {
        "started": started,
        "finished": time.time(),
        "plan": asdict(plan),
        "scenarios": scenarios,
        "servers": servers,
        "cells": bench.cells,
        "extra": bench.extra,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "argv": [PROG, *argv],
        "versions": versions(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"compare-{stamp}.json"
    raw.write_text(json.dumps(data, indent=1))
    print(f"\nraw figures: {raw.relative_to(ROOT)}")
    if args.results is None:
        args.results = str(out_dir / "RESULTS-quick.md" if plan.quick else BENCH / "RESULTS.md")
    text = write_results(data, Path(args.results) if args.results else None)
    print(text)
    return 0


def _real_plan(p: argparse.ArgumentParser, args: argparse.Namespace) -> RealPlan:
    """The real scenario's settings from the command line (``p.error`` on a bad one)."""
    sizes: dict[str, tuple[int, ...]] = {}
    for flag, text in (
        ("--infinity-batches", args.infinity_batches),
        ("--fastembed-batches", args.fastembed_batches),
    ):
        try:
            sizes[flag] = tuple(int(x) for x in text.split(",") if x)
        except ValueError:
            p.error(f"{flag} must be integers separated by commas, got {text!r}")
        if not sizes[flag] or min(sizes[flag]) < 1:
            p.error(f"{flag} must list batch sizes >= 1, got {text!r}")
    for flag, value, low in (
        ("--real-per-request", args.real_per_request, 1),
        ("--real-connections", args.real_connections, 1),
        ("--real-seconds", args.real_seconds or 1.0, 1e-3),
        ("--real-overload", args.real_overload, 1e-3),
        ("--real-half-rate", args.real_half_rate or 1.0, 1e-3),
    ):
        if value < low:
            p.error(f"{flag} must be > 0, got {value}")
    if args.baseline_src and not (Path(args.baseline_src) / "batchserve").is_dir():
        p.error(
            f"--baseline-src must be a source tree's src (with batchserve/), got "
            f"{args.baseline_src!r}"
        )
    return RealPlan(
        seconds=args.real_seconds or 20.0,
        per_request=args.real_per_request,
        connections=args.real_connections,
        overload=args.real_overload,
        infinity_batches=sizes["--infinity-batches"],
        fastembed_batches=sizes["--fastembed-batches"],
        baseline_src=str(Path(args.baseline_src).resolve()) if args.baseline_src else "",
        baseline_cache=str(Path(args.baseline_cache).resolve()),
        half_rate=args.real_half_rate,
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def report_main(argv: list[str]) -> int:
    """``report RAW [RESULTS]``: the report rebuilt from a run's raw figures."""
    p = argparse.ArgumentParser(
        prog=f"{PROG} report", description="Rebuild the report from a run's raw figures."
    )
    p.add_argument("raw", type=Path, help="bench/out/compare-<time>.json")
    p.add_argument("results", type=Path, nargs="?", help="where to write it (default: print)")
    args = p.parse_args(argv)
    print(write_results(json.loads(args.raw.read_text()), args.results))
    return 0


def servers_main(argv: list[str]) -> int:
    """``servers [SERVER ...]``: start each server, print its URL and command, stop it."""
    p = argparse.ArgumentParser(
        prog=f"{PROG} servers",
        description="A manual check: start each server, print its URL, stop it.",
    )
    p.add_argument(
        "servers", nargs="*", metavar="SERVER", help=f"of {', '.join(SERVERS)} (default: all)"
    )
    for name in p.parse_args(argv).servers or SERVERS:
        r = start(
            name,
            ModelSpec(kind="minilm" if name in REAL_MODELS_ONLY else "sleep"),
            Knobs(max_batch=32, max_wait_ms=2, queue_size=64),
            logs=BENCH / "out" / "logs",
            tag="check",
        )
        print(name, r.url, describe(r.argv), flush=True)
        r.stop()
    return 0
