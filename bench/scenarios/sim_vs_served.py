"""The simulator's prediction beside the served figures, on the Python manual's paragraphs.

How close the simulator's served throughput and p50 come to the server's, on the realistic
mix, one text a request or ``--per-request N``. This script, in one run:

1. **starts the server** (``batchserve serve`` with this script's settings) and reads from
   its ``/status`` what the simulation must match: the workers, the engine's threads,
   backend and precision, the passes' token budget;
2. **profiles** the served engine's sub-pass cost, in process: the model the server loads
   (``--model``) at the served threads, called on passes of ``n`` paragraphs of one length
   as the engine counts tokens (so each is one sub-pass: ``n`` one of the counts the
   engine's :class:`~batchserve.subpasses.ShapeGrid` allows, its ``passes.grid`` where it
   has one, the width the grid rounds to) for ``n`` in 1..32 and lengths from 16 to 256
   tokens, each timed ``--repeats`` times (the median), fitted into a
   :class:`~batchserve.subpasses.PassCost` (fixed, per token, attention) by the least
   relative error (:func:`fit_relative`). With several
   workers the same passes are timed again run by every worker at once (the cost of a pass
   that shares the machine's cores and memory with the others');
3. **measures the request path** on a server of a probe whose pass sleeps 5 ms (and answers
   vectors as long as the model's), at the same loads and the same texts a request
   (``--no-path`` skips it): a pass as its server's policy learned it, less the model's
   call in its thread, is the driver's overhead per pass; its p50 minus its simulated p50
   is what the HTTP stack and the generator add to a request; the CPU seconds the server
   and the generator spend a request are what they take from the workers' cores;
4. **simulates** the mix: every paragraph of ``pydoc_data.topics`` (``reference_paragraphs``)
   in the order the load generator sends them, Poisson arrivals, 1 s deadline, the
   server's settings and workers; the policy is told each text's estimate (what the
   server's policy sees) and each pass costs its sub-passes planned as the engine plans
   them, on its grid, from the engine's own token counts (``sim.simulate(subpass=,
   subpass_busy=, grid=, tokens=)``), plus the driver's overhead per pass. When the
   workers' threads fill the machine's cores, the CPU the event loop and the generator
   take at the load's rate stretches the busy passes by the cores over the cores left.
   Capacity is the simulated drain of a backlog; the loads are ``--loads`` times it (half
   of it, and past saturation by default);
5. **serves** the same: a warm-up at the rate, then ``batchserve load`` with the same seed
   (the same arrival schedule, the same texts in the same order, ``--inputs N``) per load;
6. prints predicted and measured texts/s and p50 side by side (the predicted p50 is the
   simulated one plus the request path measured in 3), with the error and the machine's
   load average before and after.

``--model synthetic`` (the default until the engines run sub-passes) serves a stand-in
defined here: it sleeps what its texts' sub-passes cost (``--cost FIXED,PER_TOKEN,
ATTENTION`` in seconds, planned with that cost as an engine plans), so the comparison tests
the simulator and the policy, not an engine. ``--model minilm`` (or any SPEC ``serve``
takes) profiles and serves that engine.

Run: ``python bench/scenarios/sim_vs_served.py [--model minilm] [--per-request 32]
[--seconds 20] [--json]``
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchserve.config import BatchConfig, CostEstimate
from batchserve.loadgen.texts import reference_paragraphs
from batchserve.models.token_counts import estimate_tokens
from batchserve.sim import simulate
from batchserve.subpasses import (
    PassCost,
    ShapeGrid,
    plan,
    predict_s,
    shape,
)
from batchserve.workload.arrivals import arrival_times
from batchserve_testing.bench import batchserve, cpu_s, load_report, start_load

#: This script's folder (the server imports the stand-in model from it), the repository,
#: and where the texts the generator sends are written.
FOLDER = Path(__file__).resolve().parent
ROOT = FOLDER.parents[1]
HERE = ROOT / "bench" / "out" / "sim_vs_served"
MODEL_NAME = "bench"
MAX_BATCH = 32
MAX_WAIT_S = 0.002
QUEUE = 1024
DEADLINE_S = 1.0
#: The stand-in's cost: a CPU's shape (5 ms a sub-pass, 250 us a token, attention).
SYNTHETIC_COST = "0.005,250e-6,0.5e-6"
#: The driver's seconds a pass when not measured (``--no-path``).
DEFAULT_OVERHEAD_S = 0.0005
_COST_ENV = "SIM_VS_SERVED_COST"


class SubpassSleeper:
    """A stand-in embedding model whose pass costs its length-sorted sub-passes.

    It sleeps, as a forward pass on an accelerator leaves the CPU free, for
    ``predict_s(shape(sizes, plan(sizes, cost)), cost)``, the sizes being its own
    ``token_estimate``; it answers a unit vector of 8 floats per text.
    """

    kind = "embedding"
    dimension = 8
    max_seq_length = 256

    def __init__(self, cost: PassCost) -> None:
        self.cost = cost

    def token_estimate(self, text: str) -> int:
        """The text's tokens as the built-in model estimates them."""
        return estimate_tokens(text, self.max_seq_length)

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens per text (the estimate: this model has no tokenizer)."""
        return [self.token_estimate(t) for t in texts]

    def __call__(self, texts: list[str]) -> list[list[float]]:
        """Sleep what the texts' sub-passes cost; one vector per text."""
        sizes = self.count_tokens(texts)
        time.sleep(predict_s(shape(sizes, plan(sizes, self.cost)), self.cost))
        v = 1 / math.sqrt(self.dimension)
        return [[v] * self.dimension for _ in texts]


def parse_cost(text: str) -> PassCost:
    """``FIXED,PER_TOKEN[,ATTENTION]`` in seconds."""
    parts = [float(x) for x in text.split(",")]
    if len(parts) not in (2, 3):
        raise ValueError(f"--cost must be FIXED,PER_TOKEN[,ATTENTION] in seconds, got {text!r}")
    return PassCost(
        fixed_s=parts[0],
        per_token_s=parts[1],
        attention_s=parts[2:3][0] if len(parts) == 3 else 0.0,
    )


#: What ``serve --model sim_vs_served:model`` loads in the server (the cost from the env).
model = SubpassSleeper(parse_cost(os.environ.get(_COST_ENV, SYNTHETIC_COST)))


def load_engine(spec: str, threads: int | None) -> Any:
    """The callable the server calls for ``spec`` (loaded here, in this process), at the
    served ``threads`` (None: the model's default)."""
    if spec == "synthetic":
        return model
    from batchserve.engines.loader import load_model

    if threads is not None and "threads=" not in spec:
        spec = f"{spec}{',' if ':' in spec else ':'}threads={threads}"
    return load_model(spec).fn


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """What the server runs, from its ``/status``: the simulation is set to the same."""

    workers: int
    threads: int | None
    backend: str | None
    precision: str | None
    max_batch_tokens: int | None


def served_settings(url: str) -> Served:
    """The served model's workers, engine and token budget (its ``/status`` entry)."""
    entry = status(url)
    settings, engine = entry["settings"], entry.get("engine") or {}
    return Served(
        workers=int(settings["workers"]),
        threads=engine.get("threads"),
        backend=engine.get("backend"),
        precision=engine.get("precision"),
        max_batch_tokens=settings.get("max_batch_tokens"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """The engine's profiled sub-pass cost, alone and beside the other workers' passes."""

    alone: PassCost
    busy: PassCost | None
    points: list[dict[str, Any]]


def _timed(fn: Any, batch: list[str], repeats: int, at_once: int) -> float:
    """Median seconds of ``fn(batch)``, ``at_once`` calls running together (threads)."""
    times: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(batch)
            took = time.perf_counter() - t0
            with lock:
                times.append(took)

    if at_once == 1:
        worker()
    else:
        threads = [threading.Thread(target=worker) for _ in range(at_once)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return statistics.median(times)


def profile(
    fn: Any,
    texts: list[str],
    tokens: list[int],
    repeats: int,
    grid: ShapeGrid | None,
    window: int | None,
    workers: int,
) -> Profile:
    """The engine's sub-pass cost from passes of one length (see the module docstring)."""
    by_size: dict[int, list[str]] = {}
    for t, n in zip(texts, tokens, strict=True):
        by_size.setdefault(n, []).append(t)
    counts = [n for n in (1, 4, 8, 16, 32) if grid is None or n in grid.counts]
    at = (1, workers) if workers > 1 else (1,)
    points = []
    for target in (16, 32, 64, 128, 256):
        # The most common length within 10% of the target.
        near = [s for s in by_size if abs(s - target) <= max(2, target // 10)]
        if not near:
            continue
        length = max(near, key=lambda s: len(by_size[s]))
        width = grid.width(length, window) if grid is not None else length
        pool = by_size[length]
        for n in counts:
            batch = [pool[i % len(pool)] for i in range(n)]
            point: dict[str, Any] = {"n": n, "tokens": length, "width": width}
            for at_once in at:
                _timed(fn, batch, 1, at_once)  # a new shape compiles (per infer request)
                key = "seconds" if at_once == 1 else "seconds_busy"
                point[key] = _timed(fn, batch, repeats, at_once)
            points.append(point)
    return Profile(
        alone=fit_relative(points, "seconds"),
        busy=fit_relative(points, "seconds_busy") if workers > 1 else None,
        points=points,
    )


def fit_relative(points: list[dict[str, Any]], key: str) -> PassCost:
    """The :class:`PassCost` whose predictions are off by the least relative error.

    A plain least squares (:class:`~batchserve.subpasses.PassCostModel`'s) weighs each pass
    by its seconds, so on a shared machine the noise of the 8,192-token passes (tens of
    milliseconds) decides the fixed cost of a one-text pass (a few): here each pass's error
    counts relative to its time, as the simulated p50 of short passes needs. Every
    coefficient is kept >= 0 (the best of the feature subsets whose solution is).
    """
    rows = [
        (1.0, p["n"] * p["width"], p["n"] * p["width"] ** 2, p[key]) for p in points if p[key] > 0
    ]
    x = np.array([[a / t, b / t, c / t] for a, b, c, t in rows])
    y = np.ones(len(rows))
    best: tuple[float, list[float]] | None = None
    for r in (3, 2, 1):
        for idx in itertools.combinations(range(3), r):
            coef, *_ = np.linalg.lstsq(x[:, idx], y, rcond=None)
            if min(coef) < 0:
                continue
            sse = float(np.sum((x[:, idx] @ coef - y) ** 2))
            if best is None or sse < best[0]:
                full = [0.0, 0.0, 0.0]
                for c, i in zip(coef, idx, strict=True):
                    full[i] = float(c)
                best = (sse, full)
    if best is None:
        return PassCost(fixed_s=0.0, per_token_s=0.0)
    return PassCost(fixed_s=best[1][0], per_token_s=best[1][1], attention_s=best[1][2])


@dataclass(frozen=True, slots=True, kw_only=True)
class Mix:
    """What is simulated: the texts' sizes, the engine's plan and what the cores hold."""

    sizes: list[int]
    tokens: list[int] | None
    per_request: int
    config: BatchConfig
    cost: Profile
    grid: ShapeGrid | None
    window: int | None
    overhead_s: float
    #: CPU seconds the event loop and the generator spend a request (0: not measured).
    path_cpu_s: float = 0.0
    #: Cores the workers' threads fill (0: they leave the loop a core of its own).
    cores: float = 0.0

    def busy_cost(self, requests_per_s: float) -> PassCost | None:
        """The cost of a pass beside the others', stretched by the loop's CPU at this rate."""
        busy = self.cost.busy
        if busy is None or not self.cores or not self.path_cpu_s:
            return busy
        left = max(self.cores - requests_per_s * self.path_cpu_s, 0.25 * self.cores)
        k = self.cores / left
        return PassCost(
            fixed_s=busy.fixed_s * k,
            per_token_s=busy.per_token_s * k,
            attention_s=busy.attention_s * k,
        )

    def run(self, arrivals: list[float], **kw: Any) -> Any:
        """``simulate`` on these arrivals (requests of ``per_request`` texts, in order)."""
        k = self.per_request
        m = len(self.sizes)
        picks = [i % m for i in range(len(arrivals) * k)]
        rate = kw.pop("requests_per_s")
        return simulate(
            config=kw.pop("config", self.config),
            cost=CostEstimate(fixed_s=0.0, per_item_s=0.0),
            arrivals=arrivals,
            sizes=[self.sizes[i] for i in picks],
            tokens=None if self.tokens is None else [self.tokens[i] for i in picks],
            subpass=self.cost.alone,
            subpass_busy=self.busy_cost(rate),
            grid=self.grid,
            window=self.window,
            items_per_request=k,
            overhead_s=self.overhead_s,
            **kw,
        )


def simulated(mix: Mix, rate: float, cap: float, seconds: float, seed: int) -> dict[str, Any]:
    """The simulator's figures for one load (``rate`` and ``cap`` in requests/s)."""
    arrivals = arrival_times(rate=rate, duration_s=seconds, arrivals="poisson", seed=seed)
    r = mix.run(
        arrivals,
        requests_per_s=min(rate, cap),
        timeout_s=DEADLINE_S,
        duration_s=seconds,
    )
    return {
        "ok_per_s": r.items_ok_per_s,
        "p50_ms": r.summary.p50_ms,
        "p99_ms": r.summary.p99_ms,
        "passes": r.batches,
        "mean_batch": round(r.summary.avg_batch, 2),
    }


def capacity(mix: Mix) -> float:
    """Requests per second the simulated server clears with a backlog always waiting.

    The loop's share of the cores grows with the rate: the capacity is the rate at which
    the passes, stretched by that share, clear that rate (a few rounds of the fixed point).
    """
    n = max(1, min(len(mix.sizes), 2000) // mix.per_request)
    config = dataclasses.replace(mix.config, queue_size=n * mix.per_request)
    cap = 0.0
    for _ in range(4):
        r = mix.run([0.0] * n, requests_per_s=cap, config=config, drain=True)
        cap = n / r.end_s
    return cap


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """One generator run: offered rate, length, deadline (the generator gives up there too)."""

    rate: float
    duration_s: float
    deadline_ms: float


def drive(
    url: str, load: Load, seed: int, texts: Path, arrivals: str, per_request: int
) -> dict[str, Any]:
    """One ``batchserve load`` run (this Python, the OpenAI API, ``per_request`` texts a
    request, the texts in order); its JSON summary."""
    proc = start_load(
        url,
        {
            "api": "openai",
            "model": MODEL_NAME,
            "texts": texts,
            "inputs": per_request,
            "arrivals": arrivals,
            "rate": f"{load.rate:g}",
            "duration": f"{load.duration_s:g}s",
            "timeout": f"{load.deadline_ms:g}ms",
            "client_timeout": f"{load.deadline_ms:g}ms",
            "seed": seed,
        },
    )
    return load_report(proc, load.duration_s + 120)


def status(url: str) -> dict[str, Any]:
    """The served model's entry of ``/status``."""
    with urllib.request.urlopen(f"{url}/status", timeout=10) as resp:
        entry: dict[str, Any] = json.loads(resp.read())["models"][MODEL_NAME]
        return entry


def serve_flags(spec: str) -> list[str]:
    """``batchserve serve``'s flags for ``spec`` with this script's settings."""
    return [
        "--model",
        f"{MODEL_NAME}={spec}",
        "--max-batch-size",
        str(MAX_BATCH),
        "--max-wait",
        f"{MAX_WAIT_S * 1e3:g}ms",
        "--queue-size",
        str(QUEUE),
        "--timeout",
        f"{DEADLINE_S:g}s",
    ]


def measure(
    srv: Any, path: Path, rates: list[float], seconds: float, seed: int, per_request: int
) -> list[dict[str, Any]]:
    """The load generator's figures for each rate (requests/s), against a running server."""
    rows = []
    for rate in rates:
        drive(
            srv.url,
            Load(rate=rate, duration_s=3.0, deadline_ms=DEADLINE_S * 1e3),
            seed + 1000,
            path,
            "poisson",
            per_request,
        )
        time.sleep(DEADLINE_S + 0.5)
        load = Load(rate=rate, duration_s=seconds, deadline_ms=DEADLINE_S * 1e3)
        before = status(srv.url)
        cpu0 = cpu_s(srv.proc.pid)
        row = drive(srv.url, load, seed, path, "poisson", per_request)
        cpu1 = cpu_s(srv.proc.pid)
        after = status(srv.url)
        passes = after["batches"]["passes"] - before["batches"]["passes"]
        items = after["batches"]["items"] - before["batches"]["items"]
        tok_b, tok_a = before["tokens"] or {}, after["tokens"] or {}
        real = tok_a.get("real", 0) - tok_b.get("real", 0)
        row["server"] = {
            "passes": passes,
            "mean_batch": round(items / passes, 2) if passes else 0.0,
            "waste": round((tok_a["padded"] - tok_b["padded"]) / real, 3) if real else None,
            "fit": {k: tok_a.get(k) for k in ("fixed_s", "per_token_s", "attention_s")},
            "pass_fit": {k: after["cost"].get(k) for k in ("fixed_s", "per_item_s")},
            "cpu_s": round(cpu1 - cpu0, 3),
            "forward_s": round(_forward_s(after) - _forward_s(before), 4),
        }
        # An engine that runs sub-passes says what they computed and the cost it learned
        # (``/status`` ``passes``): beside the policy's own plan and fit.
        eng_b, eng_a = before.get("passes") or {}, after.get("passes") or {}
        if eng_a.get("passes", 0) > eng_b.get("passes", 0):
            real_e = eng_a["real_tokens"] - eng_b["real_tokens"]
            row["server"]["engine"] = {
                "subpasses_per_pass": round(
                    (eng_a["subpasses"] - eng_b["subpasses"]) / (eng_a["passes"] - eng_b["passes"]),
                    2,
                ),
                "waste": round((eng_a["computed_tokens"] - eng_b["computed_tokens"]) / real_e, 3)
                if real_e
                else None,
                "cost": eng_a.get("cost"),
                "shapes": eng_a.get("shapes"),
            }
        rows.append(row)
        time.sleep(DEADLINE_S + 0.5)
    return rows


def _forward_s(entry: dict[str, Any]) -> float:
    """Seconds the model's calls took so far, in its worker threads (``/status``)."""
    return float(sum(m["passes"] * m["mean_forward_s"] for m in entry["cost"]["measured"]))


#: The probe: a model whose pass sleeps 5 ms whatever it holds (a pass that leaves the CPU,
#: as an engine's forward does, so waking for the answer is measured too).
PROBE_S = 0.005


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestPath:
    """What the request path measured on the probe adds (see :func:`request_path`)."""

    p50_ms: list[float]
    overhead_s: float
    cpu_s: float


def request_path(
    path: Path,
    rates: list[float],
    seconds: float,
    seed: int,
    env: dict[str, str],
    per_request: int,
    dimension: int,
) -> RequestPath:
    """What the driver adds to a pass, the request's path to p50 and its CPU, at each rate.

    The same load against the probe, served: a pass as its policy learned it less the
    model's call (``/status``: the pass fit at the mean pass, the calls' mean seconds) is
    what the driver adds to a pass (handing it to a thread, waking for its answer, which
    waits for the event loop's hold on the interpreter); its p50 minus the
    same load's simulated p50 (with that overhead) is what the HTTP stack, the generator and
    the machine's scheduling add to a request; the CPU seconds the server and the generator
    spend a request (the probe's pass takes none) is what they take from the cores. The
    simulator models none of them on its own.
    """
    spec = f"synthetic:fixed={PROBE_S * 1e3:g}ms,per_item=0ms,dim={dimension}"
    with batchserve(serve_flags(spec), env=env) as srv:
        workers = served_settings(srv.url).workers
        rows = measure(srv, path, rates, seconds, seed, per_request)
    # A pass as the policy learned it (from dispatch to the answer back on the loop) less
    # the model's call in its thread (the probe's sleep and its vectors): the driver's.
    fits = []
    for row in rows:
        srv_ = row["server"]
        if srv_["passes"]:
            fit = srv_["pass_fit"]
            mean = (fit["fixed_s"] or 0.0) + (fit["per_item_s"] or 0.0) * srv_["mean_batch"]
            fits.append(mean - srv_["forward_s"] / srv_["passes"])
    overhead = max(0.0, statistics.median(fits)) if fits else 0.0
    out = []
    cpu = []
    for rate, row in zip(rates, rows, strict=True):
        arrivals = arrival_times(rate=rate, duration_s=seconds, arrivals="poisson", seed=seed)
        r = simulate(
            config=BatchConfig(
                max_batch_size=MAX_BATCH, max_wait_s=MAX_WAIT_S, queue_size=QUEUE, workers=workers
            ),
            cost=CostEstimate(fixed_s=PROBE_S, per_item_s=0.0),
            arrivals=arrivals,
            timeout_s=DEADLINE_S,
            duration_s=seconds,
            overhead_s=overhead,
            items_per_request=per_request,
        )
        out.append(row["p50_ms"] - r.summary.p50_ms)
        requests = row["ok"] + row["timed_out"]
        if requests:
            # The probe's own calls (past its sleep: its vectors) are no part of the path.
            own = max(0.0, row["server"]["forward_s"] - row["server"]["passes"] * PROBE_S)
            cpu.append((row["server"]["cpu_s"] + row["cpu_s"] - own) / requests)
    return RequestPath(
        p50_ms=out, overhead_s=overhead, cpu_s=statistics.median(cpu) if cpu else 0.0
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic", help="synthetic, minilm or a serve SPEC")
    ap.add_argument("--cost", default=SYNTHETIC_COST, help="the synthetic model's sub-pass cost")
    ap.add_argument("--per-request", type=int, default=1, help="texts in each request")
    ap.add_argument("--loads", default="0.5,1.5", help="rates as fractions of capacity")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per load")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per profiled pass")
    ap.add_argument(
        "--overhead",
        type=float,
        help="driver seconds per pass, simulated (default: measured on the probe; 0.5 ms "
        "with --no-path)",
    )
    ap.add_argument(
        "--no-path",
        action="store_true",
        help="skip measuring the driver's overhead and the request path (on the probe)",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object at the end")
    args = ap.parse_args(argv)
    if args.per_request < 1:
        ap.error("--per-request must be >= 1")
    k = args.per_request
    load_before = os.getloadavg()
    texts = list(reference_paragraphs())
    HERE.mkdir(parents=True, exist_ok=True)
    path = HERE / "manual.txt"
    path.write_text("\n".join(texts) + "\n")
    env = {
        _COST_ENV: args.cost,
        "PYTHONPATH": os.pathsep.join(
            [str(FOLDER), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    os.environ[_COST_ENV] = args.cost
    global model
    model = SubpassSleeper(parse_cost(args.cost))
    spec = "sim_vs_served:model" if args.model == "synthetic" else args.model
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(batchserve(serve_flags(spec), env=env))
        here = served_settings(srv.url)
        fn = load_engine(args.model, here.threads)
        dimension = int(getattr(fn, "dimension", None) or 8)
        passes = getattr(fn, "passes", None)
        grid: ShapeGrid | None = getattr(passes, "grid", None)
        window: int | None = getattr(getattr(fn, "head", None), "window", None)
        mine = (getattr(fn, "backend", None), getattr(fn, "dtype", None))
        if here.backend is not None and mine != (here.backend, here.precision):
            raise SystemExit(
                f"the server runs {here.backend}/{here.precision}, this process loaded "
                f"{mine[0]}/{mine[1]}: the profile would be of another engine"
            )
        estimate = getattr(fn, "token_estimate", None)
        sizes = [estimate(t) if callable(estimate) else estimate_tokens(t, 256) for t in texts]
        counted = getattr(fn, "count_tokens", None)
        tokens = list(counted(texts)) if callable(counted) else None
        prof = profile(fn, texts, tokens or sizes, args.repeats, grid, window, here.workers)
        print(
            f"served: {here.workers} workers x {here.threads} threads, "
            f"{here.backend}/{here.precision}, grid {'yes' if grid else 'none'}; "
            f"profiled {args.model} alone: {_cost(prof.alone)}"
            + (f"; beside {here.workers - 1} other passes: {_cost(prof.busy)}" if prof.busy else "")
            + f" ({len(prof.points)} passes)",
            file=sys.stderr,
            flush=True,
        )
        del fn
        config = BatchConfig(
            max_batch_size=MAX_BATCH,
            max_wait_s=MAX_WAIT_S,
            queue_size=QUEUE,
            workers=here.workers,
            max_batch_tokens=here.max_batch_tokens,
        )
        threads = (here.threads or 1) * here.workers
        cores = os.cpu_count() or 1
        mix = Mix(
            sizes=sizes,
            tokens=tokens,
            per_request=k,
            config=config,
            cost=prof,
            grid=grid,
            window=window,
            overhead_s=args.overhead if args.overhead is not None else DEFAULT_OVERHEAD_S,
        )
        cap = capacity(mix)
        fractions = [float(x) for x in args.loads.split(",")]
        rates = [round(f * cap, 2) for f in fractions]
        paths: list[float | None] = [None] * len(rates)
        if not args.no_path:
            measured = request_path(
                path, rates, min(args.seconds, 10.0), args.seed, env, k, dimension
            )
            paths = list(measured.p50_ms)
            mix = dataclasses.replace(
                mix,
                overhead_s=args.overhead if args.overhead is not None else measured.overhead_s,
                path_cpu_s=measured.cpu_s,
                cores=float(cores) if threads >= cores else 0.0,
            )
            cap = capacity(mix)
            rates = [round(f * cap, 2) for f in fractions]
            print(
                f"the probe (a pass of {PROBE_S * 1e3:g} ms), served: the driver adds "
                f"{measured.overhead_s * 1e3:.3f} ms a pass; its p50 is "
                f"{', '.join(f'{p:.1f}' for p in measured.p50_ms)} ms more than simulated (the "
                f"request path); the server and the generator spend {measured.cpu_s * 1e3:.2f} "
                f"ms of CPU a request"
                + (f" (taken from the workers' {cores} cores)" if mix.cores else ""),
                file=sys.stderr,
                flush=True,
            )
        print(
            f"simulated capacity {cap * k:.1f} texts/s; loads {[round(r * k, 1) for r in rates]} "
            f"texts/s",
            file=sys.stderr,
            flush=True,
        )
        predicted = [simulated(mix, r, cap, args.seconds, args.seed) for r in rates]
        served_rows = measure(srv, path, rates, args.seconds, args.seed, k)
    load_after = os.getloadavg()
    rows = []
    for f, rate, pr, m, extra in zip(fractions, rates, predicted, served_rows, paths, strict=True):
        p50 = pr["p50_ms"] + (extra or 0.0)
        ok = m["ok_per_s"] * k
        row = {
            "load": f,
            "texts_per_s_offered": round(rate * k, 2),
            "predicted_ok_texts_per_s": round(pr["ok_per_s"], 2),
            "measured_ok_texts_per_s": round(ok, 2),
            "ok_error": round(pr["ok_per_s"] / ok - 1, 4) if ok else None,
            "simulated_p50_ms": round(pr["p50_ms"], 2),
            "request_path_ms": None if extra is None else round(extra, 2),
            "predicted_p50_ms": round(p50, 2),
            "measured_p50_ms": m["p50_ms"],
            "p50_error": round(p50 / m["p50_ms"] - 1, 4) if m["p50_ms"] else None,
            "predicted_p99_ms": round(pr["p99_ms"] + (extra or 0.0), 2),
            "measured_p99_ms": m["p99_ms"],
            "predicted_mean_batch": pr["mean_batch"],
            "generator_cpu_s": m["cpu_s"],
            "server": m["server"],
        }
        learned = (m["server"].get("engine") or {}).get("cost")
        if learned:
            # The same load simulated with the sub-pass cost the served engine learned in
            # this run (its forwards only, beside the other worker and the loop): what is
            # left of the error is not the profile's.
            again = dataclasses.replace(
                mix,
                cost=Profile(alone=PassCost(**learned), busy=None, points=[]),
                path_cpu_s=0.0,
            )
            w = simulated(again, rate, capacity(again), args.seconds, args.seed)
            row["with_served_cost"] = {
                "ok_texts_per_s": round(w["ok_per_s"], 2),
                "p50_ms": round(w["p50_ms"] + (extra or 0.0), 2),
                "mean_batch": w["mean_batch"],
            }
        rows.append(row)
    out = {
        "model": args.model,
        "per_request": k,
        "served": dataclasses.asdict(here),
        "grid": grid is not None,
        "cost": _cost_dict(prof.alone),
        "cost_busy": _cost_dict(prof.busy) if prof.busy else None,
        "profile": prof.points,
        "path_cpu_s": mix.path_cpu_s,
        "capacity_texts_per_s": cap * k,
        "overhead_s": mix.overhead_s,
        "rows": rows,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"\n{k} text{'s' if k > 1 else ''} a request, {here.workers} workers x {here.threads} "
        f"threads\n{'load':>5} {'texts/s':>8} {'ok sim':>8} {'served':>8} {'err':>7} "
        f"{'p50 sim':>8} {'served':>8} {'err':>7} {'p99 sim':>8} {'served':>8}"
    )
    for r in rows:
        print(
            f"{r['load']:>5} {r['texts_per_s_offered']:>8.1f} "
            f"{r['predicted_ok_texts_per_s']:>8.1f} "
            f"{r['measured_ok_texts_per_s']:>8.1f} {_pct(r['ok_error']):>7} "
            f"{r['predicted_p50_ms']:>8.1f} {r['measured_p50_ms']:>8.1f} {_pct(r['p50_error']):>7} "
            f"{r['predicted_p99_ms']:>8.1f} {r['measured_p99_ms']:>8.1f}"
        )
    for r in rows:
        srv_ = r["server"]
        fit = srv_["fit"]
        line = (
            f"  load {r['load']}: passes of {srv_['mean_batch']} served, "
            f"{r['predicted_mean_batch']} simulated; served waste {srv_['waste']}"
        )
        if fit.get("fixed_s") is not None:
            line += (
                f"; the server's pass fit {fit['fixed_s'] * 1e3:.3f} ms + "
                f"{fit['per_token_s'] * 1e6:.2f} us/token + "
                f"{(fit.get('attention_s') or 0) * 1e9:.2f} ns/token x length"
            )
        engine = srv_.get("engine")
        if engine is not None:
            c = engine["cost"] or {}
            line += (
                f"; the engine ran {engine['subpasses_per_pass']} sub-passes a pass, waste "
                f"{engine['waste']}, learned {c.get('fixed_s', 0) * 1e3:.3f} ms + "
                f"{c.get('per_token_s', 0) * 1e6:.2f} us/token"
            )
        if "with_served_cost" in r:
            w = r["with_served_cost"]
            line += (
                f"; simulated with the engine's learned cost: {w['ok_texts_per_s']:.1f} "
                f"texts/s, p50 {w['p50_ms']:.1f} ms, passes of {w['mean_batch']}"
            )
        if r["request_path_ms"] is not None:
            line += (
                f"; p50 simulated {r['simulated_p50_ms']:.1f} ms + the request path "
                f"{r['request_path_ms']:.1f} ms"
            )
        line += f"; CPU: server {srv_['cpu_s']:.1f} s, generator {r['generator_cpu_s']:.1f} s"
        print(line)
    print(
        f"\nload average before "
        f"{load_before[0]:.1f}, after {load_after[0]:.1f} ({os.cpu_count()} cores)"
    )
    return 0


def _cost(c: PassCost | None) -> str:
    if c is None:
        return "n/a"
    return (
        f"{c.fixed_s * 1e3:.3f} ms a sub-pass + {c.per_token_s * 1e6:.2f} us a token + "
        f"{c.attention_s * 1e9:.2f} ns a token x length"
    )


def _cost_dict(c: PassCost) -> dict[str, float]:
    return {"fixed_s": c.fixed_s, "per_token_s": c.per_token_s, "attention_s": c.attention_s}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


if __name__ == "__main__":
    sys.exit(main())
