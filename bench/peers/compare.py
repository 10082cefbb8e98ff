"""batchserve beside the servers a user would pick instead, in one run on one machine.

Servers: batchserve, LitServe, Mosec, Ray Serve (each with its own dynamic batching set to
the cell's max batch and max wait) and a plain FastAPI endpoint without batching (the
baseline). Each peer runs from its own virtual environment, made by
``bench/peers/setup.py`` (run first, once). Every server serves the same model behind the
same contract (OpenAI ``POST /v1/embeddings``), and the project's open-loop generator
(``batchserve load --json``) drives each in turn with the same schedule.

Scenarios:

1. ``seed``: the Go seed's experiment: 600 requests/s, 250 ms deadline, the synthetic model
   (8 ms per call + 0.25 ms per item, sleeping), max batch 32 with max wait 2 ms and 20 ms,
   and batch 1;
2. ``overload``: 3x and 5x the model's batched capacity (32 / (8 + 32 * 0.25) ms = 2,000/s)
   for 10 s each;
3. ``framework``: a model that returns at once; the rate steps up (x1.5) until p99 exceeds
   50 ms or more than 1% of requests fail, then three bisections (in ratio) between the last
   rate held and the first that failed narrow the gap to about 5%; the highest rate every
   repeat held, and the server's own CPU per request there (every process of it, from
   ``/proc``): where the generator itself falls behind its schedule beside every server,
   the ladder has found the machine's limit rather than a server's, and the CPU per
   request is what still tells the servers apart;
4. ``real``: all-MiniLM-L6-v2 on real paragraphs (Python's reference manual), 32 texts per
   request closed loop and one text per request open loop (past saturation, at half
   capacity): batchserve as ``scripts/serve`` runs it and pinned to torch float32, another
   source tree's batchserve (``--baseline-src``), Infinity on each engine at its best batch
   size, fastembed in process, and ``SentenceTransformer.encode`` on each request's texts
   as the yardstick (``compare_real.py`` says how; its contenders are ``--real-contenders``,
   not ``--servers``).

Order of events in a cell: start the server, wait until it answers, warm it up (1 s at a low
rate, discarded), then for each repeat: read its batch counters, run the generator, wait
until the server is idle, read the counters again (their difference gives the run's average
batch, whatever the server), and stop the server. A caller gives up at its deadline (as in
the Go seed), whatever the server does with the request.

Every cell is repeated (``--repeats``, at least 2 for a report); tables show the median of
the repeats, with the range where it matters, and ratios against the best peer. The raw
figures go to ``bench/out/compare-<time>.json``; ``bench/RESULTS.md`` is written from them.

Run: ``python bench/peers/compare.py [--scenarios seed,overload,framework,real]
[--servers batchserve,litserve,...] [--repeats 2] [--quick] [--batchserve-flags '--prefetch
off']`` (the last adds flags to every batchserve server: an A/B run of one setting); the
real scenario alone, before and after: ``bench/peers/compare.py --scenarios real --baseline-src
/tmp/baseline/src``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import compare_real
from compare_real import IN_PROCESS, REAL_SERVERS, RealPlan
from compare_report import versions, write_results
from compare_servers import (
    BENCH,
    MAIN_PYTHON,
    MODEL_NAME,
    PEERS,
    ROOT,
    SERVERS,
    Knobs,
    ModelSpec,
    Running,
    available,
    describe,
    server_env,
    start,
)

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
#: Every request carries one of these texts (cycled), written to a file for the generator
#: (``--texts``) and read by the ``encode``-alone sweep: 256 texts of 12 common words.
TEXT_COUNT, TEXT_WORDS = 256, 12
TEXTS_FILE = BENCH / "out" / "texts.txt"


def write_texts() -> Path:
    """Write the benchmark's input texts (the project's generator, seed 0) to TEXTS_FILE."""
    from batchserve.loadgen import generate_texts

    TEXTS_FILE.parent.mkdir(parents=True, exist_ok=True)
    TEXTS_FILE.write_text("\n".join(generate_texts(TEXT_COUNT, words=TEXT_WORDS, seed=0)) + "\n")
    return TEXTS_FILE


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """How long each kind of run lasts, and how often it is repeated."""

    repeats: int
    seed_s: float
    overload_s: float
    step_s: float
    real_s: float
    warmup_s: float
    quick: bool

    @classmethod
    def make(cls, *, quick: bool, repeats: int | None) -> Plan:
        if quick:
            return cls(
                repeats=repeats or 1,
                seed_s=1.5,
                overload_s=3.0,
                step_s=1.5,
                real_s=4.0,
                warmup_s=0.5,
                quick=True,
            )
        return cls(
            repeats=repeats or 2,
            seed_s=5.0,
            overload_s=10.0,
            step_s=3.0,
            real_s=20.0,
            warmup_s=1.0,
            quick=False,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """One generator run: offered rate, length, deadline (the caller gives up there too)."""

    rate: float
    duration_s: float
    deadline_ms: float


def capacity_per_s(
    max_batch: int, fixed_ms: float = FIXED_MS, per_item_ms: float = PER_ITEM_MS
) -> float:
    """Items per second the synthetic model clears in full batches of ``max_batch``."""
    return max_batch / ((fixed_ms + max_batch * per_item_ms) / 1e3)


# ---------------------------------------------------------------- the generator


def generator_argv(
    url: str, load: Load, seed: int, *, texts: Path = TEXTS_FILE, arrivals: str = "constant"
) -> list[str]:
    """The ``batchserve load`` command line of one run (``texts``: one per line, cycled)."""
    return [
        str(MAIN_PYTHON),
        "-m",
        "batchserve",
        "load",
        url,
        "--api",
        "openai",
        "--model",
        MODEL_NAME,
        "--texts",
        str(texts),
        "--arrivals",
        arrivals,
        "--rate",
        f"{load.rate:g}",
        "--duration",
        f"{load.duration_s:g}s",
        "--timeout",
        f"{load.deadline_ms:g}ms",
        "--client-timeout",
        f"{load.deadline_ms:g}ms",
        "--seed",
        str(seed),
        "--json",
        "--quiet",
    ]


def drive(
    url: str, load: Load, seed: int, *, texts: Path = TEXTS_FILE, arrivals: str = "constant"
) -> dict[str, Any]:
    """Run the generator once against ``url``; its JSON summary.

    Raises:
        RuntimeError: the generator failed or printed no JSON object.
    """
    argv = generator_argv(url, load, seed, texts=texts, arrivals=arrivals)
    limit = load.duration_s + load.deadline_ms / 1e3 + 120
    res = subprocess.run(
        argv, cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=limit, check=False
    )
    for line in reversed(res.stdout.strip().splitlines()):
        if line.startswith("{"):
            summary: dict[str, Any] = json.loads(line)
            return summary
    raise RuntimeError(
        f"generator exited {res.returncode} with no JSON: {describe(argv)}\n{res.stderr[-2000:]}"
    )


# ---------------------------------------------------------------- cells


def _wait_idle(run: Running, limit_s: float = 60.0) -> None:
    """Wait until the server's batch counters stop moving (a backlog drained)."""
    deadline = time.monotonic() + limit_s
    last = run.batch_counters()
    stable = 0
    while time.monotonic() < deadline and stable < 3:
        time.sleep(0.2)
        now = run.batch_counters()
        stable = stable + 1 if now == last else 0
        last = now


def measure(run: Running, load: Load, seed: int) -> dict[str, Any]:
    """One generator run with the server-side batch counters around it."""
    before = run.batch_counters()
    m_before = run.metrics() if run.name == "batchserve" else {}
    cpu0, t0 = run.cpu_s(), time.monotonic()
    summary = drive(run.url, load, seed)
    wall = time.monotonic() - t0
    cpu = run.cpu_s() - cpu0  # before the idle wait's own requests to the server
    _wait_idle(run)
    after = run.batch_counters()
    batches, items = after[0] - before[0], after[1] - before[1]
    out = dict(summary)
    out.update(
        server_batches=batches,
        server_items=items,
        server_avg_batch=round(items / batches, 2) if batches else None,
        wall_s=round(wall, 2),
        # The server's own CPU over the run (every process of it), per request sent: what
        # a request costs it, apart from the generator's share of the machine.
        server_cpu_s=round(cpu, 3),
        server_cpu_us_per_request=round(1e6 * cpu / max(1, summary.get("sent", 0)), 1),
    )
    if run.name == "batchserve":
        m_after = run.metrics()
        out["server_outcomes"] = {
            k[len("batchserve_items_total[") : -1]: m_after[k] - m_before.get(k, 0.0)
            for k in m_after
            if k.startswith("batchserve_items_total[")
        }
    return out


class Bench:
    """Runs cells and keeps every figure, the commands and the failures."""

    def __init__(self, plan: Plan, servers: list[str], logs: Path) -> None:
        self.plan = plan
        self.servers = servers
        self.logs = logs
        self.cells: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.batchserve_flags: tuple[str, ...] = ()  # added to every batchserve cell
        self.real: RealPlan | None = None  # the real scenario's settings
        self.real_contenders: list[str] = []
        self.real_json = False  # print the real scenario's rows as JSON lines

    def cell(
        self,
        scenario: str,
        config: str,
        server: str,
        model: ModelSpec,
        knobs: Knobs,
        loads: list[Load],
        *,
        stop_when: Any = None,
        fresh_each_repeat: bool = False,
    ) -> dict[str, Any]:
        """Start ``server``, run each load ``plan.repeats`` times, stop it; the cell's record.

        ``stop_when(runs)`` (optional) ends the list of loads early once it returns True for
        the repeats of one load (the framework scenario's rate steps). With
        ``fresh_each_repeat`` every repeat gets a newly started server (after an overload,
        a server with an unbounded queue would still be working off the last run's backlog).
        """
        tag = f"{scenario}-{config}".replace(" ", "_").replace(",", "")
        if server == "batchserve" and self.batchserve_flags:
            knobs = replace(knobs, extra=knobs.extra + self.batchserve_flags)
        rec: dict[str, Any] = {
            "scenario": scenario,
            "config": config,
            "server": server,
            "knobs": asdict(knobs),
            "model": asdict(model),
            "steps": [],
            "loadavg_1m": next(iter(_loadavg()), None),
        }
        why = available(server, model)
        if why:
            rec["error"] = why
            self.cells.append(rec)
            print(f"  {server:<10} skipped: {why}", flush=True)
            return rec
        rounds = self.plan.repeats if fresh_each_repeat else 1
        per_round = 1 if fresh_each_repeat else self.plan.repeats
        runs_by_load: list[list[dict[str, Any]]] = [[] for _ in loads]
        try:
            for round_ in range(rounds):
                done = self._round(
                    rec,
                    server,
                    model,
                    knobs,
                    loads,
                    runs_by_load,
                    seeds=range(round_ * per_round, (round_ + 1) * per_round),
                    tag=tag,
                    stop_when=stop_when,
                    last=round_ == rounds - 1,
                )
                if not done:
                    break
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
            print(f"  {server:<10} FAILED: {rec['error'][:400]}", flush=True)
        self.cells.append(rec)
        return rec

    def _round(
        self,
        rec: dict[str, Any],
        server: str,
        model: ModelSpec,
        knobs: Knobs,
        loads: list[Load],
        runs_by_load: list[list[dict[str, Any]]],
        *,
        seeds: range,
        tag: str,
        stop_when: Any,
        last: bool,
    ) -> bool:
        """One server start: warm up, then each load once per seed. False: stop the cell."""
        t0 = time.monotonic()
        run = start(server, model, knobs, logs=self.logs, tag=tag)
        try:
            rec["command"] = describe(run.argv)
            rec.setdefault("startup_s", []).append(round(time.monotonic() - t0, 1))
            warm = Load(
                rate=min(100.0, loads[0].rate),
                duration_s=self.plan.warmup_s,
                deadline_ms=max(loads[0].deadline_ms, 1000.0),
            )
            drive(run.url, warm, seed=999)
            _wait_idle(run)
            for i, load in enumerate(loads):
                runs = runs_by_load[i]
                for seed in seeds:
                    runs.append(measure(run, load, seed=seed))
                    time.sleep(0.3)
                if not last:
                    continue
                step = {
                    "load": asdict(load),
                    "runs": runs,
                    "generator": describe(generator_argv(run.url, load, 0)),
                }
                rec["steps"].append(step)
                print(f"  {server:<10} {short(step)}", flush=True)
                if stop_when is not None and stop_when(runs):
                    break
        finally:
            run.stop()
        return True


def short(step: dict[str, Any]) -> str:
    """One console line for a step: offered rate and the repeats' key figures."""
    parts = []
    for r in step["runs"]:
        batch = r.get("server_avg_batch")
        parts.append(
            f"{r.get('ok_per_s', 0):7.0f} ok/s p99 {r.get('p99_ms', 0):7.1f} ms "
            f"rej {r.get('rejected', 0):5d} t/o {r.get('timed_out', 0):5d} "
            f"err {r.get('errors', 0):4d} batch {batch if batch is not None else '-'}"
        )
    return f"{step['load']['rate']:7.0f}/s: " + " | ".join(parts)


# ---------------------------------------------------------------- scenarios


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
    """MiniLM on real paragraphs, every contender of ``bench.real`` (compare_real.py)."""
    print("\n== real: all-MiniLM-L6-v2 on the paragraphs of Python's reference manual", flush=True)
    assert bench.real is not None
    record = compare_real.run(bench.real, bench.real_contenders, bench.logs)
    bench.extra["real"] = record
    print("\n" + compare_real.table(record), flush=True)
    if bench.real_json:
        for row in compare_real.summary_rows(record):
            print(json.dumps(row), flush=True)


RUNNERS = {
    "seed": seed_scenario,
    "overload": overload_scenario,
    "framework": framework_scenario,
    "real": real_scenario,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    real = p.add_argument_group("the real scenario (compare_real.py)")
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
    load_before = _loadavg()
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
        "loadavg_after": _loadavg(),
        "argv": ["bench/peers/compare.py", *(sys.argv[1:] if argv is None else argv)],
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


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


if __name__ == "__main__":
    sys.exit(main())
