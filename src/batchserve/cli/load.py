"""``batchserve load URL``: open-loop load on a running server, and what callers saw.

Requests go out on a schedule fixed in advance (``--rate``, ``--duration``, ``--arrivals``,
``--seed``), never paced by answers; latency runs from each request's scheduled send time.
The report has the seed's columns and the generator's own health (lag behind schedule, CPU).
A ``grpc://host:port`` URL sends KServe's ``ModelInfer`` over gRPC
(:mod:`batchserve.loadgen.grpc_client`) instead of HTTP. ``--json`` and ``--csv`` print
machine-readable rows; ``--sweep R1,R2,...`` runs each rate in
turn and ``--plot FILE`` draws the sweep. Progress goes to stderr (``--quiet`` hides it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from batchserve.cli._common import HelpFormatter, duration, falls_back, int_range, positive_int
from batchserve.errors import ConfigError
from batchserve.loadgen import (
    DEFAULT_MODEL,
    LoadConfig,
    LoadReport,
    LoadRun,
    Progress,
    ProgressDisplay,
    format_csv,
    generate_texts,
    plot_sweep,
    read_texts,
    run_load,
    run_sweep,
)
from batchserve.loadgen.config import APIS
from batchserve.loadgen.runner import run_mix
from batchserve.server.settings import API_KEY_ENV
from batchserve.sim.mix import parse_stream
from batchserve.units import parse_rates
from batchserve.workload.arrivals import ARRIVAL_MODES

__all__ = ["add_parser", "config_from_args"]

#: The environment variable ``batchserve serve`` also reads its key from.

#: Requests per second one sender process is given under ``--processes auto``.
AUTO_RATE_PER_PROCESS = 10_000.0


def _processes(text: str) -> int | str:
    if text == "auto":
        return text
    return positive_int(text)


def add_parser(sub: Any) -> None:
    """Register the ``load`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "load",
        help="open-loop HTTP or gRPC load on a server (no coordinated omission)",
        description="Send requests on a schedule fixed in advance, never paced by answers, "
        "and report what callers saw, latency counted from each scheduled send time.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "url",
        help="the server's base URL, e.g. http://127.0.0.1:8000, or grpc://127.0.0.1:8001 "
        "for KServe's ModelInfer over gRPC",
    )
    w = p.add_argument_group("what to send")
    falls_back(
        w.add_argument("--api", choices=APIS, default=None, help="protocol"),
        "openai; kserve, the only one, with a grpc:// url",
    )
    w.add_argument("--model", default=DEFAULT_MODEL, help="model name")
    w.add_argument("--inputs", metavar="N", type=positive_int, default=1, help="inputs per request")
    w.add_argument("--texts", metavar="FILE", help="input texts, one per line (cycled)")
    w.add_argument(
        "--text-words",
        metavar="N|LOW:HIGH",
        type=int_range,
        default=12,
        help="words per generated text, or a range drawn uniformly, e.g. 3:200",
    )
    w.add_argument(
        "--text-count",
        metavar="N",
        type=positive_int,
        default=256,
        help="distinct generated texts",
    )
    w.add_argument(
        "--timeout",
        metavar="DURATION",
        type=duration,
        default=None,
        help="each request's deadline, sent to the server",
    )
    w.add_argument(
        "--absolute-deadline",
        choices=("on", "off"),
        default="on",
        help="also send the deadline as X-Request-Deadline, the scheduled send time plus "
        "--timeout in Unix epoch seconds (off for a server whose clock is not this "
        "machine's)",
    )
    w.add_argument(
        "--client-timeout",
        metavar="DURATION",
        type=duration,
        default=None,
        help="give up on a request this long after its scheduled time (timeout + 1s, or 30s)",
    )
    w.add_argument(
        "--kserve-input", metavar="NAME", default="text", help="KServe input tensor name"
    )
    falls_back(
        w.add_argument(
            "--api-key",
            metavar="KEY",
            default=os.environ.get(API_KEY_ENV) or None,
            help="sent as 'Authorization: Bearer KEY'",
        ),
        f"${API_KEY_ENV}",
    )
    w.add_argument(
        "--priority",
        metavar="CLASS",
        help="the class of work of every request: X-Priority (and KServe's "
        "parameters.priority); the report's rows carry it",
    )
    w.add_argument("--tenant", metavar="NAME", help="sent as X-Tenant")
    w.add_argument(
        "--mix",
        action="append",
        metavar="CLASS:rate=R[,inputs=N,timeout=T,tenant=NAME,arrivals=A,seed=S]",
        help="mixed traffic: one stream of requests naming CLASS (X-Priority) per --mix, "
        "all started together, each in its own sender process and reported on its own row "
        "(as `simulate --mix` predicts them); replaces --rate, --inputs, --priority",
    )
    s = p.add_argument_group("schedule")
    s.add_argument("--rate", metavar="PER_S", type=float, default=100.0, help="requests per second")
    s.add_argument(
        "--duration", metavar="DURATION", type=duration, default="10s", help="schedule length"
    )
    s.add_argument("--arrivals", choices=ARRIVAL_MODES, default="constant", help="arrival process")
    s.add_argument(
        "--seed", metavar="N", type=int, default=0, help="seed of poisson arrivals and texts"
    )
    s.add_argument(
        "--sweep", metavar="RATES", help="run each of these comma-separated rates in turn"
    )
    s.add_argument(
        "--sweep-pause",
        metavar="DURATION",
        type=duration,
        default="1s",
        help="pause between sweep runs",
    )
    g = p.add_argument_group("generator")
    g.add_argument(
        "--processes",
        metavar="N",
        type=_processes,
        default=1,
        help=f"sender processes, or auto (one per {AUTO_RATE_PER_PROCESS:g}/s, at most one "
        "per CPU)",
    )
    g.add_argument(
        "--max-connections",
        metavar="N",
        type=positive_int,
        default=10_000,
        help="cap on open connections, over all processes",
    )
    g.add_argument(
        "--max-dials",
        metavar="N",
        type=positive_int,
        default=32,
        help="cap on connection attempts in progress, per process",
    )
    g.add_argument(
        "--warm-connections",
        metavar="N",
        type=positive_int,
        default=32,
        help="connections each process opens before the start (32): at overload a request "
        "holds its connection until answered, so rate x latency of them are needed",
    )
    o = p.add_argument_group("output")
    fmt = o.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object per run")
    fmt.add_argument("--csv", action="store_true", help="CSV with a header row")
    o.add_argument("--plot", metavar="FILE", help="with --sweep: write a PNG")
    o.add_argument("--name", metavar="LABEL", default="", help="the row's label")
    o.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=run)


def config_from_args(
    args: argparse.Namespace,
    *,
    rate: float | None = None,
    sweep: bool = False,
    texts: tuple[str, ...] | None = None,
) -> LoadConfig:
    """The :class:`LoadConfig` the flags describe (at ``rate`` if given, in a sweep).

    ``texts`` are the inputs already read or generated from the flags (a sweep reads them
    once for all its rates); None reads or generates them here.
    """
    rate = args.rate if rate is None else rate
    name = f"{args.name} {rate:g}/s" if sweep and args.name else args.name
    if texts is None:
        texts = (
            read_texts(args.texts)
            if args.texts
            else generate_texts(args.text_count, words=args.text_words, seed=args.seed)
        )
    processes = args.processes
    if processes == "auto":
        processes = max(1, min(os.cpu_count() or 1, math.ceil(rate / AUTO_RATE_PER_PROCESS)))
    return LoadConfig(
        url=args.url,
        api=args.api or ("kserve" if args.url.startswith("grpc://") else "openai"),
        model=args.model,
        texts=texts,
        inputs_per_request=args.inputs,
        timeout_s=args.timeout,
        absolute_deadline=args.absolute_deadline == "on",
        client_timeout_s=args.client_timeout,
        rate=rate,
        duration_s=args.duration,
        arrivals=args.arrivals,
        seed=args.seed,
        processes=processes,
        max_connections=max(args.max_connections, processes),
        max_dials=args.max_dials,
        warm_connections=args.warm_connections,
        kserve_input=args.kserve_input,
        api_key=args.api_key,
        priority=args.priority,
        tenant=args.tenant,
        name=name,
    )


def _header(cfg: LoadConfig, rates: list[float]) -> str:
    deadline = f"{cfg.timeout_s * 1e3:g}ms" if cfg.timeout_s is not None else "none"
    offered = ", ".join(f"{r:g}" for r in rates)
    return (
        f"target: {cfg.url} ({cfg.api}, model {cfg.model}, {cfg.inputs_per_request} "
        f"input{'s' if cfg.inputs_per_request > 1 else ''}/request)\n"
        f"offered load: {offered} requests/s for {cfg.duration_s:g}s each, {cfg.arrivals} "
        f"arrivals (seed {cfg.seed}), deadline {deadline}, {cfg.processes} sender "
        f"process{'es' if cfg.processes > 1 else ''}\n"
    )


def _run_mix(args: argparse.Namespace) -> int:
    if args.sweep:
        raise ConfigError("--mix and --sweep do not go together")
    base = config_from_args(args)
    configs = []
    for text in args.mix:
        s = parse_stream(text)
        configs.append(
            dataclasses.replace(
                base,
                rate=s.rate,
                inputs_per_request=s.inputs,
                timeout_s=s.timeout_s if s.timeout_s is not None else base.timeout_s,
                arrivals=s.arrivals,
                seed=s.seed,
                priority=s.work_class,
                tenant=s.tenant if s.tenant is not None else base.tenant,
                processes=1,
                name=f"{args.name} {s.label}" if args.name else s.label,
            )
        )
    if not (args.json or args.csv):
        print(f"target: {base.url} ({base.api}, model {base.model}), {len(configs)} streams\n")
    runs = run_mix(configs)
    reports = [r.report for r in runs]
    if args.json:
        for report in reports:
            print(json.dumps(report.to_dict()), flush=True)
    elif args.csv:
        print(format_csv(reports, header=True), end="", flush=True)
    else:
        for report in reports:
            print(f"{report.summary.name}: {report.inputs_per_request} inputs/request")
            print(report.format_text() + "\n", flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the load (or the sweep) and print the report."""
    if args.mix:
        return _run_mix(args)
    if args.rate <= 0:
        raise ConfigError(f"--rate must be > 0, got {args.rate}")
    rates = parse_rates(args.sweep, name="--sweep") if args.sweep else [args.rate]
    if args.plot and not args.sweep:
        raise ConfigError("--plot needs --sweep RATES (a plot of one run says nothing)")
    texts = config_from_args(args).texts
    configs = {
        rate: config_from_args(args, rate=rate, sweep=bool(args.sweep), texts=texts)
        for rate in rates
    }
    first = configs[rates[0]]
    if not (args.json or args.csv):
        print(_header(first, rates))

    displays: list[ProgressDisplay] = []

    def progress(cfg: LoadConfig) -> Callable[[Progress], None] | None:
        if args.quiet:
            return None
        display = ProgressDisplay(
            sys.stderr,
            total=len(cfg.schedule()),
            duration_s=cfg.duration_s,
            label=cfg.label,
        )
        displays.append(display)
        return display

    printed_header = False

    def emit(run_: LoadRun) -> None:
        nonlocal printed_header
        for display in displays:
            display.close()
        report = run_.report
        if args.json:
            print(json.dumps(report.to_dict()), flush=True)
        elif args.csv:
            print(format_csv([report], header=not printed_header), end="", flush=True)
            printed_header = True
        else:
            print(report.format_text() + "\n", flush=True)
        if (args.json or args.csv) and report.warnings:
            for warning in report.warnings:
                print(f"warning: {report.summary.name}: {warning}", file=sys.stderr)

    if args.sweep:
        reports: list[LoadReport] = run_sweep(
            [configs[r] for r in rates], pause_s=args.sweep_pause, on_run=emit, progress=progress
        )
        if args.plot:
            plot_sweep(reports, args.plot, title=_title(first))
            if not (args.json or args.csv):
                print(f"plot written to {args.plot}")
    else:
        emit(run_load(first, on_progress=progress(first)))
    return 0


def _title(cfg: LoadConfig) -> str:
    return f"batchserve load: {cfg.url} ({cfg.api}, {cfg.model}), {cfg.arrivals} arrivals"
