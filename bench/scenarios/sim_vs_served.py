"""The simulator's prediction beside the served figures, on the Python manual's paragraphs.

How close the simulator's served throughput and p50 come to the server's, on the realistic
mix. This script, in one run:

1. **profiles** the served engine's sub-pass cost, in process: the model the server loads
   (``--model``), called on passes of ``n`` paragraphs of one length (so each is one
   sub-pass) for ``n`` in 1..32 and lengths from 16 to 256 tokens, each timed
   ``--repeats`` times (the median), fitted with :class:`~batchserve.subpasses.PassCostModel`
   into a :class:`~batchserve.subpasses.PassCost` (fixed, per token, attention). Sizes are
   the model's ``token_estimate``, what the server's policy sees;
2. **simulates** the mix: every paragraph of ``pydoc_data.topics`` (``reference_paragraphs``),
   one per request in the order the load generator sends them, Poisson arrivals, 1 s
   deadline, the server's settings; each pass costs its length-sorted sub-passes planned
   with the profiled cost (``sim.simulate(subpass=...)``), plus the driver's overhead per
   pass. Capacity is the simulated drain of a backlog; the loads are ``--loads`` times it
   (half of it, and past saturation by default). The overhead, and what the request path
   adds to p50, are measured first on a server of a probe whose pass sleeps 5 ms, at the
   same loads (``--no-path`` skips it: 0.5 ms a pass, nothing added);
3. **serves** the same: ``batchserve serve`` with the same settings, a warm-up at the rate,
   then ``batchserve load`` with the same seed (the same arrival schedule, the same texts in
   the same order) per load;
4. prints predicted and measured ok/s and p50 side by side, with the error and the
   machine's load average before and after.

``--model synthetic`` (the default until the engines run sub-passes) serves a stand-in
defined here: it sleeps what its texts' sub-passes cost (``--cost FIXED,PER_TOKEN,
ATTENTION`` in seconds, planned with that cost as an engine plans), so the comparison tests
the simulator and the policy, not an engine. ``--model minilm`` (or any SPEC ``serve``
takes) profiles and serves that engine.

Run: ``python bench/scenarios/sim_vs_served.py [--model minilm] [--seconds 20] [--json]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchserve.config import BatchConfig, CostEstimate
from batchserve.loadgen.texts import reference_paragraphs
from batchserve.models.token_counts import estimate_tokens
from batchserve.sim import simulate
from batchserve.subpasses import PassCost, PassCostModel, Shape, plan, predict_s, shape
from batchserve.workload.arrivals import arrival_times
from batchserve_testing.bench import batchserve, load_report, start_load

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


def load_engine(spec: str) -> Any:
    """The callable the server calls for ``spec`` (loaded here, in this process)."""
    if spec == "synthetic":
        return model
    from batchserve.engines.loader import load_model

    return load_model(spec).fn


def profile(fn: Any, texts: list[str], repeats: int) -> tuple[PassCost, list[dict[str, Any]]]:
    """The engine's sub-pass cost from passes of one length (see the module docstring)."""
    estimate = getattr(fn, "token_estimate", None)
    size_of = estimate if callable(estimate) else (lambda t: estimate_tokens(t, 256))
    by_size: dict[int, list[str]] = {}
    for t in texts:
        by_size.setdefault(size_of(t), []).append(t)
    fit = PassCostModel(PassCost(fixed_s=0.0, per_token_s=0.0), decay=1.0, min_samples=3)
    points = []
    fn(texts[:8])  # warm
    for target in (16, 32, 64, 128, 256):
        # The most common length within 10% of the target.
        near = [s for s in by_size if abs(s - target) <= max(2, target // 10)]
        if not near:
            continue
        length = max(near, key=lambda s: len(by_size[s]))
        pool = by_size[length]
        for n in (1, 4, 8, 16, 32):
            batch = [pool[i % len(pool)] for i in range(n)]
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn(batch)
                times.append(time.perf_counter() - t0)
            seconds = statistics.median(times)
            fit.observe(Shape(1, n * length, n * length * length), seconds)
            points.append({"n": n, "tokens": length, "seconds": seconds})
    return fit.estimate, points


def simulated(
    sizes: list[int], cost: PassCost, rate: float, seconds: float, seed: int, overhead_s: float
) -> dict[str, Any]:
    """The simulator's figures for one load."""
    arrivals = arrival_times(rate=rate, duration_s=seconds, arrivals="poisson", seed=seed)
    r = simulate(
        config=BatchConfig(max_batch_size=MAX_BATCH, max_wait_s=MAX_WAIT_S, queue_size=QUEUE),
        cost=CostEstimate(fixed_s=0.0, per_item_s=0.0),
        arrivals=arrivals,
        timeout_s=DEADLINE_S,
        duration_s=seconds,
        sizes=[sizes[i % len(sizes)] for i in range(len(arrivals))],
        subpass=cost,
        overhead_s=overhead_s,
    )
    return {
        "ok_per_s": r.summary.ok_per_s,
        "p50_ms": r.summary.p50_ms,
        "p99_ms": r.summary.p99_ms,
        "passes": r.batches,
        "mean_batch": round(r.summary.avg_batch, 2),
    }


def capacity(sizes: list[int], cost: PassCost, overhead_s: float) -> float:
    """Texts per second the simulated server clears with a backlog always waiting."""
    n = min(len(sizes), 2000)
    r = simulate(
        config=BatchConfig(max_batch_size=MAX_BATCH, max_wait_s=MAX_WAIT_S, queue_size=n),
        cost=CostEstimate(fixed_s=0.0, per_item_s=0.0),
        arrivals=[0.0] * n,
        sizes=sizes[:n],
        subpass=cost,
        overhead_s=overhead_s,
        drain=True,
    )
    return n / r.end_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """One generator run: offered rate, length, deadline (the generator gives up there too)."""

    rate: float
    duration_s: float
    deadline_ms: float


def drive(url: str, load: Load, seed: int, texts: Path, arrivals: str) -> dict[str, Any]:
    """One ``batchserve load`` run (this Python, the OpenAI API, one text a request, the
    texts in order); its JSON summary."""
    proc = start_load(
        url,
        {
            "api": "openai",
            "model": MODEL_NAME,
            "texts": texts,
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


def served(
    spec: str, path: Path, rates: list[float], seconds: float, seed: int, env: dict[str, str]
) -> list[dict[str, Any]]:
    """The load generator's figures for each rate, against one server."""
    flags = [
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
    rows = []
    with batchserve(flags, env=env) as srv:
        for rate in rates:
            drive(
                srv.url,
                Load(rate=rate, duration_s=3.0, deadline_ms=DEADLINE_S * 1e3),
                seed + 1000,
                path,
                "poisson",
            )
            time.sleep(DEADLINE_S + 0.5)
            load = Load(rate=rate, duration_s=seconds, deadline_ms=DEADLINE_S * 1e3)
            before = status(srv.url)
            row = drive(srv.url, load, seed, path, "poisson")
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
            }
            # An engine that runs sub-passes says what they computed and the cost it learned
            # (``/status`` ``passes``): beside the policy's own plan and fit.
            eng_b, eng_a = before.get("passes") or {}, after.get("passes") or {}
            if eng_a.get("passes", 0) > eng_b.get("passes", 0):
                real_e = eng_a["real_tokens"] - eng_b["real_tokens"]
                row["server"]["engine"] = {
                    "subpasses_per_pass": round(
                        (eng_a["subpasses"] - eng_b["subpasses"])
                        / (eng_a["passes"] - eng_b["passes"]),
                        2,
                    ),
                    "waste": round(
                        (eng_a["computed_tokens"] - eng_b["computed_tokens"]) / real_e, 3
                    )
                    if real_e
                    else None,
                    "cost": eng_a.get("cost"),
                }
            rows.append(row)
            time.sleep(DEADLINE_S + 0.5)
    return rows


#: The probe: a model whose pass sleeps 5 ms whatever it holds (a pass that leaves the CPU,
#: as an engine's forward does, so waking for the answer is measured too).
PROBE_S = 0.005
PROBE_SPEC = f"synthetic:fixed={PROBE_S * 1e3:g}ms,per_item=0ms,dim=8"


def request_path(
    path: Path, rates: list[float], seconds: float, seed: int, env: dict[str, str]
) -> tuple[list[float], float]:
    """What the driver adds to a pass, and the request's path to p50, at each rate.

    The same load against the probe, served: the fixed cost its server fits beyond the
    probe's 5 ms is what the driver adds to a pass (handing it to a thread, waking for its
    answer, which waits for the event loop's hold on the interpreter); its p50 minus the
    same load's simulated p50 (with that overhead) is what the HTTP stack, the generator and
    the machine's scheduling add to a request. The simulator models neither on its own.
    """
    rows = served(PROBE_SPEC, path, rates, seconds, seed, env)
    fits = [row["server"]["pass_fit"]["fixed_s"] or PROBE_S for row in rows]
    overhead = max(0.0, statistics.median(fits) - PROBE_S)
    out = []
    for rate, row in zip(rates, rows, strict=True):
        arrivals = arrival_times(rate=rate, duration_s=seconds, arrivals="poisson", seed=seed)
        r = simulate(
            config=BatchConfig(max_batch_size=MAX_BATCH, max_wait_s=MAX_WAIT_S, queue_size=QUEUE),
            cost=CostEstimate(fixed_s=PROBE_S, per_item_s=0.0),
            arrivals=arrivals,
            timeout_s=DEADLINE_S,
            duration_s=seconds,
            overhead_s=overhead,
        )
        out.append(row["p50_ms"] - r.summary.p50_ms)
    return out, overhead


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic", help="synthetic, minilm or a serve SPEC")
    ap.add_argument("--cost", default=SYNTHETIC_COST, help="the synthetic model's sub-pass cost")
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
    fn = load_engine(args.model)
    cost, points = profile(fn, texts, args.repeats)
    print(
        f"profiled {args.model}: {cost.fixed_s * 1e3:.3f} ms a sub-pass + "
        f"{cost.per_token_s * 1e6:.2f} us a token + {cost.attention_s * 1e9:.2f} ns a token "
        f"x length ({len(points)} passes)",
        flush=True,
    )
    size_of = getattr(fn, "token_estimate", None)
    sizes = [size_of(t) if callable(size_of) else estimate_tokens(t, 256) for t in texts]
    overhead = args.overhead if args.overhead is not None else DEFAULT_OVERHEAD_S
    cap = capacity(sizes, cost, overhead)
    fractions = [float(x) for x in args.loads.split(",")]
    rates = [round(f * cap, 1) for f in fractions]
    print(f"simulated capacity {cap:.1f} texts/s; loads {rates}", flush=True)
    paths: list[float | None] = [None] * len(rates)
    if not args.no_path:
        measured_paths, driver_s = request_path(
            path, rates, min(args.seconds, 10.0), args.seed, env
        )
        paths = list(measured_paths)
        if args.overhead is None:
            overhead = driver_s
        print(
            f"the probe (a pass of {PROBE_S * 1e3:g} ms), served: the driver adds "
            f"{driver_s * 1e3:.3f} ms a pass; its p50 is "
            f"{', '.join(f'{p:.1f}' for p in measured_paths)} ms more than simulated (the "
            "request path)",
            flush=True,
        )
    predicted = [simulated(sizes, cost, r, args.seconds, args.seed, overhead) for r in rates]
    measured = served(spec, path, rates, args.seconds, args.seed, env)
    load_after = os.getloadavg()
    rows = []
    for f, rate, p, m, extra in zip(fractions, rates, predicted, measured, paths, strict=True):
        row = {
            "load": f,
            "rate": rate,
            "predicted_ok_per_s": round(p["ok_per_s"], 2),
            "measured_ok_per_s": m["ok_per_s"],
            "ok_error": round(p["ok_per_s"] / m["ok_per_s"] - 1, 4) if m["ok_per_s"] else None,
            "predicted_p50_ms": round(p["p50_ms"], 2),
            "measured_p50_ms": m["p50_ms"],
            "p50_error": round(p["p50_ms"] / m["p50_ms"] - 1, 4) if m["p50_ms"] else None,
            "predicted_p99_ms": round(p["p99_ms"], 2),
            "measured_p99_ms": m["p99_ms"],
            "predicted_mean_batch": p["mean_batch"],
            "request_path_ms": None if extra is None else round(extra, 2),
            "server": m["server"],
        }
        fit = m["server"]["fit"]
        if fit.get("fixed_s") is not None:
            # The same load simulated with the cost the server's policy learned (its driver's
            # overhead inside): what is left of the error is not the engine's profile.
            served_cost = PassCost(
                fixed_s=fit["fixed_s"],
                per_token_s=fit["per_token_s"],
                attention_s=fit.get("attention_s") or 0.0,
            )
            again = simulated(sizes, served_cost, rate, args.seconds, args.seed, 0.0)
            row["with_served_fit"] = {k: round(v, 2) for k, v in again.items()}
        rows.append(row)
    out = {
        "model": args.model,
        "cost": {
            "fixed_s": cost.fixed_s,
            "per_token_s": cost.per_token_s,
            "attention_s": cost.attention_s,
        },
        "capacity": cap,
        "overhead_s": overhead,
        "rows": rows,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"\n{'load':>5} {'rate/s':>8} {'ok/s sim':>9} {'served':>8} {'err':>7} "
        f"{'p50 sim':>8} {'served':>8} {'err':>7} {'p99 sim':>8} {'served':>8}"
    )
    for r in rows:
        print(
            f"{r['load']:>5} {r['rate']:>8.1f} {r['predicted_ok_per_s']:>9.1f} "
            f"{r['measured_ok_per_s']:>8.1f} {_pct(r['ok_error']):>7} "
            f"{r['predicted_p50_ms']:>8.1f} {r['measured_p50_ms']:>8.1f} {_pct(r['p50_error']):>7} "
            f"{r['predicted_p99_ms']:>8.1f} {r['measured_p99_ms']:>8.1f}"
        )
    for r in rows:
        srv = r["server"]
        fit = srv["fit"]
        line = (
            f"  load {r['load']}: passes of {srv['mean_batch']} served, "
            f"{r['predicted_mean_batch']} simulated; served waste {srv['waste']}"
        )
        if fit.get("fixed_s") is not None:
            line += (
                f"; the server's fit {fit['fixed_s'] * 1e3:.3f} ms + "
                f"{fit['per_token_s'] * 1e6:.2f} us/token + "
                f"{(fit.get('attention_s') or 0) * 1e9:.2f} ns/token x length"
            )
        engine = srv.get("engine")
        if engine is not None:
            c = engine["cost"] or {}
            line += (
                f"; the engine ran {engine['subpasses_per_pass']} sub-passes a pass, waste "
                f"{engine['waste']}, learned {c.get('fixed_s', 0) * 1e3:.3f} ms + "
                f"{c.get('per_token_s', 0) * 1e6:.2f} us/token"
            )
        if "with_served_fit" in r:
            w = r["with_served_fit"]
            line += f"; simulated with it: ok/s {w['ok_per_s']:.1f}, p50 {w['p50_ms']:.1f} ms"
        extra = r["request_path_ms"]
        if extra is not None:
            p50 = r["predicted_p50_ms"] + extra
            err = p50 / r["measured_p50_ms"] - 1 if r["measured_p50_ms"] else None
            line += (
                f"; the request path adds {extra:.1f} ms to p50 (the probe, served):"
                f" simulated p50 + that = {p50:.1f} ms ({_pct(err)})"
            )
        print(line)
    print(
        f"\nload average before "
        f"{load_before[0]:.1f}, after {load_after[0]:.1f} ({os.cpu_count()} cores)"
    )
    return 0


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


if __name__ == "__main__":
    sys.exit(main())
