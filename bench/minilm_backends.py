"""The built-in MiniLM on each engine (backend and precision): throughput and quality.

The engines are those ``serve --backend auto`` would consider on this machine
(:func:`batchserve.engines.hardware.candidates`: torch float32, bfloat16 and autocast
where the CPU computes in bfloat16, float16 on a GPU; ONNX Runtime float32 and int8;
OpenVINO float32, bfloat16 where the CPU has it, and its NNCF int8), or ``--backends``.
Each is loaded as ``batchserve serve`` loads it (exports cached in ``--cache-dir``) and

* **throughput**: one forward pass after another on batches of each ``--batch-sizes``,
  for ``--seconds`` each, over ``--rounds`` rounds that alternate the engines (so a
  neighbour's load on this shared machine falls on all of them alike); the best round
  per size is kept, and the best size is the row's ``batch_size`` and ``items_per_s``;
* **quality**: the embeddings of the quality set (the shipped one, or ``--quality-set``)
  against torch fp32's, as the gate measures them: mean and min cosine, and the fraction
  of retrieval queries whose nearest passage is unchanged.

Texts: ``--texts short`` (3-16 words, as queries are) or ``mixed`` (3-200 words, the
realistic length mix). ``--json`` prints one object per engine with the keys ``backend,
precision, dtype, device, threads, batch_size, items_per_s, speedup_vs_torch,
items_per_cpu_s, cpu_speedup_vs_torch, mean_cosine, min_cosine, ranking_agreement,
passes_gate, gated, chosen, by_batch_size``; ``gated`` is whether it may be served on
quality, ``chosen`` marks the engine ``auto``'s rule (the fastest gated one) picks from
these figures. On a shared machine the wall-clock rate depends on the neighbours; the rate
per CPU second of this process does much less (with one thread it is what an idle core
gives), hence both.

Run: ``.venv/bin/python bench/minilm_backends.py [--threads 1] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.choice import Trial, pick
from batchserve.engines.hardware import REFERENCE, Engine, Machine, candidates, installed_backends
from batchserve.engines.loader import load_model
from batchserve.engines.quality import compare
from batchserve.engines.quality_set import load as load_quality_set
from batchserve.engines.quality_set import read as read_quality_set
from batchserve.engines.runtime import resolve_device


def texts_for(kind: str, n: int = 512, seed: int = 11) -> list[str]:
    """``short``: 3-16 words; ``mixed``: 3-200 words (uniform), from the quality set's words."""
    words = " ".join(load_quality_set().texts).split()
    rng = random.Random(seed)
    hi = 16 if kind == "short" else 200
    out = []
    for _ in range(n):
        k = rng.randint(3, hi)
        start = rng.randrange(len(words) - k)
        out.append(" ".join(words[start : start + k]))
    return out


def rate(fn: Any, texts: list[str], batch: int, seconds: float) -> tuple[float, float]:
    """Items per wall second and per CPU second of this process, running ``fn`` on
    consecutive batches of ``batch`` texts for ``seconds``.

    The CPU figure is what a pass costs whatever else the machine runs: with one thread it
    is the rate an idle core would give; the wall figure is what this run got.
    """
    fn(texts[:batch])
    done, i = 0, 0
    c0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn([texts[(i + k) % len(texts)] for k in range(batch)])
        i += batch
        done += batch
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return done / wall, done / max(cpu, 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backends",
        default="auto",
        help="auto (every engine this machine offers) or backend[/precision],... "
        "e.g. torch,onnx-int8,openvino/bfloat16",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: serve's)")
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--seconds", type=float, default=2.0, help="per size and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--texts", choices=["short", "mixed"], default="short")
    parser.add_argument("--no-quality", action="store_true")
    parser.add_argument("--quality-set", help="JSON {texts, queries, passages} or text lines")
    parser.add_argument("--cache-dir", help="where exports are cached")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    args = parser.parse_args()

    def spec(engine: Engine) -> str:
        on = args.device if engine.backend == "torch" else "cpu"
        opts = [f"backend={engine.backend}", f"device={on}", f"dtype={engine.dtype}"]
        if args.threads:
            opts.append(f"threads={args.threads}")
        if args.cache_dir:
            opts.append(f"cache_dir={args.cache_dir}")
        return "minilm:" + ",".join(opts)

    machine = Machine.here()
    device = resolve_device(args.device, cuda_devices=len(machine.cuda_devices), mps=machine.mps)
    if args.backends == "auto":
        offered = candidates(machine, device, installed_backends())
        for c in offered:
            if c.unavailable:
                print(f"[skip] {c.engine}: {c.unavailable}", file=sys.stderr)
        variants = [c.engine for c in offered if not c.unavailable]
    else:
        variants = []
        for item in args.backends.split(","):
            backend, _, dtype = item.strip().partition("/")
            if not dtype:
                dtype = "int8" if backend.endswith("-int8") else "float32"
            variants.append(Engine(backend, dtype))
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    models: dict[Engine, Any] = {}
    for engine in variants:
        t0 = time.perf_counter()
        models[engine] = load_model(spec(engine)).fn
        print(f"[load] {engine}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    texts = texts_for(args.texts)
    rates: dict[Engine, dict[int, float]] = {v: {} for v in variants}
    cpu_rates: dict[Engine, dict[int, float]] = {v: {} for v in variants}
    for r in range(args.rounds):
        for v, fn in models.items():
            for b in sizes:
                wall, cpu = rate(fn, texts, b, args.seconds)
                rates[v][b] = max(rates[v].get(b, 0.0), wall)
                cpu_rates[v][b] = max(cpu_rates[v].get(b, 0.0), cpu)
            print(f"[round {r + 1}] {v}: {rates[v]}", file=sys.stderr)
    quality: dict[Engine, Any] = {}
    if not args.no_quality:
        qs = read_quality_set(Path(args.quality_set)) if args.quality_set else load_quality_set()
        reference: Any = models.get(REFERENCE) or load_model(spec(REFERENCE)).fn
        for v, fn in models.items():
            quality[v] = None if v == REFERENCE else compare(reference, fn, qs)
    trials = [
        Trial(engine=v, items_per_s=max(rates[v].values()), quality=quality.get(v)) for v in models
    ]
    chosen = pick(trials) if quality else None
    gated = {t.engine: t.gated for t in trials}
    base = rates.get(REFERENCE)
    base_best = max(base.values()) if base else None
    base_cpu = cpu_rates.get(REFERENCE)
    base_cpu_best = max(base_cpu.values()) if base_cpu else None
    rows = []
    for v, fn in models.items():
        best = max(rates[v], key=lambda b: rates[v][b])
        cpu_best = max(cpu_rates[v].values())
        q = quality.get(v)
        rows.append(
            {
                "backend": v.backend,
                "precision": v.dtype,
                "dtype": v.dtype,
                "device": getattr(fn, "device", "cpu"),
                "threads": getattr(fn, "threads", None),
                "texts": args.texts,
                "batch_size": best,
                "items_per_s": round(rates[v][best], 1),
                "speedup_vs_torch": round(rates[v][best] / base_best, 3) if base_best else None,
                "items_per_cpu_s": round(cpu_best, 1),
                "cpu_speedup_vs_torch": (
                    round(cpu_best / base_cpu_best, 3) if base_cpu_best else None
                ),
                "mean_cosine": round(q.mean_cosine, 5) if q else None,
                "min_cosine": round(q.min_cosine, 5) if q else None,
                "ranking_agreement": round(q.ranking_agreement, 4) if q else None,
                "passes_gate": q.passes if q else None,
                "gated": gated.get(v) if quality else None,
                "chosen": v == chosen if chosen is not None else None,
                "by_batch_size": {str(b): round(x, 1) for b, x in rates[v].items()},
            }
        )
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(
        f"{'backend':14} {'precision':14} {'device':7} {'thr':>3} {'batch':>5} {'items/s':>8} "
        f"{'vs torch':>8} {'/cpu-s':>7} {'vs torch':>8} {'mean cos':>8} {'min cos':>8} "
        f"{'NN kept':>7} gate"
    )
    gates = {True: "pass", False: "FAIL", None: "-"}
    for row in rows:
        gate = "reference" if row["backend"] == "torch" and row["precision"] == "float32" else ""
        gate = gate or gates[row["passes_gate"]]
        gate += " *chosen" if row["chosen"] else ""
        print(
            f"{row['backend']:14} {row['precision']:14} {row['device']:7} "
            f"{row['threads'] or '-':>3} "
            f"{row['batch_size']:5d} {row['items_per_s']:8.1f} "
            f"{row['speedup_vs_torch'] or 0:7.2f}x {row['items_per_cpu_s']:7.1f} "
            f"{row['cpu_speedup_vs_torch'] or 0:7.2f}x {row['mean_cosine'] or 0:8.4f} "
            f"{row['min_cosine'] or 0:8.4f} {row['ranking_agreement'] or 0:7.3f} {gate}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
