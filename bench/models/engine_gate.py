"""The quality gate of every engine, as ``--backend auto`` runs it, with its cost.

For each engine ``serve --backend auto`` would consider on this machine
(:func:`batchserve.engines.hardware.candidates`), or ``--engines``, loaded as the server
loads it (exports cached in ``--cache-dir``), the gate's figures against torch float32 on
the gate's texts (:func:`batchserve.engines.gate.default_quality_set`: the shipped set and
the paragraphs of Python's reference manual):

* ``mean_cos``, ``min_cos``: cosine of each text's two embeddings (set and paragraphs);
* ``qa_kept``: the fraction of retrieval queries whose nearest passage is unchanged;
* ``nn_kept``, ``top10``: each paragraph ranked against the others: the fraction whose
  nearest is unchanged, the mean overlap of their ten nearest;
* ``invariance``: the smallest cosine between a text alone and the same text among random
  batch-mates (64 shipped texts of every length);
* ``gate_s``: what the gate took for this engine (its passes over every text and the
  invariance probes; the reference's vectors excluded: ``reference_s``, once per model and
  Python, is what computing them took, 0 when they were cached); ``gate_cpu_s`` is the
  CPU time it took this process, what it takes on a quiet machine with ``--threads 1``;
* ``auto``: whether ``auto`` may serve it (it holds every bound); ``servable``: whether it may
  be served when named (its meaning kept).

The gate is measured afresh here (nothing read from the gate's cache). On a shared machine
``gate_s`` depends on the neighbours.

Run: ``python bench/models/engine_gate.py [--threads 1] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.embeddings import builtin_path
from batchserve.engines.gate import default_quality_set, reference_vectors
from batchserve.engines.hardware import REFERENCE, Engine, Machine, candidates, installed_backends
from batchserve.engines.loader import _load_engine
from batchserve.engines.quality import against, itself
from batchserve.engines.runtime import Runtime, default_cache_dir


def main() -> int:
    """Gate each engine; print a table, or one JSON object per engine with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", help="backend/dtype,... (default: every candidate here)")
    parser.add_argument("--threads", type=int, default=1, help="threads per pass")
    parser.add_argument("--cache-dir", help="exports and the reference (default: the cache)")
    parser.add_argument("--json", action="store_true", help="one JSON object per engine")
    args = parser.parse_args()
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if args.engines:
        engines = [Engine.parse(e.strip()) for e in args.engines.split(",")]
    else:
        options = candidates(Machine.here(gpus=False), "cpu", installed_backends())
        engines = [o.engine for o in options if o.unavailable is None]
    source = builtin_path()
    qs = default_quality_set()
    start = time.perf_counter()
    ref = reference_vectors(source, cache, qs, threads=args.threads)
    reference_s = time.perf_counter() - start
    print(f"[reference] {len(ref)} texts: {reference_s:.1f}s", file=sys.stderr)
    rows = []
    for engine in engines:
        runtime = Runtime(
            backend=engine.backend,
            dtype=engine.dtype,
            device="cpu",
            threads=args.threads,
            cache_dir=str(cache),
        )
        fn: Any = _load_engine(source, runtime, gated=False)
        cpu = time.process_time()
        q = itself(fn, qs) if engine == REFERENCE else against(ref, fn, qs, precision=engine.dtype)
        cpu = time.process_time() - cpu
        row = {
            "engine": str(engine),
            "mean_cos": round(q.mean_cosine, 5),
            "min_cos": round(q.min_cosine, 5),
            "qa_kept": round(q.ranking_agreement, 4),
            "nn_kept": None if q.nearest_kept is None else round(q.nearest_kept, 4),
            "top10": None if q.top10_overlap is None else round(q.top10_overlap, 4),
            "invariance": round(q.invariance, 7),
            "texts": q.texts,
            "paragraphs": q.neighbours,
            "probes": q.probes,
            "gate_s": round(q.seconds, 1),
            "gate_cpu_s": round(cpu, 1),
            "reference_s": round(reference_s, 1),
            "auto": q.passes,
            "servable": q.servable,
            "failed": ", ".join(q.failed_bounds()),
        }
        print(f"[gate] {json.dumps(row)}", file=sys.stderr)
        rows.append(row)
        del fn
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(
        f"{'engine':24} {'mean cos':>8} {'min cos':>8} {'QA kept':>7} {'NN kept':>7} "
        f"{'top-10':>6} {'invariant':>9} {'gate s':>6}  auto"
    )
    for row in rows:
        kept = "-" if row["nn_kept"] is None else f"{row['nn_kept']:.1%}"
        top = "-" if row["top10"] is None else f"{row['top10']:.3f}"
        verdict = "yes" if row["auto"] else f"no ({row['failed']})"
        print(
            f"{row['engine']:24} {row['mean_cos']:8.4f} {row['min_cos']:8.4f} "
            f"{row['qa_kept']:7.1%} {kept:>7} {top:>6} {row['invariance']:9.6f} "
            f"{row['gate_s']:6.1f}  {verdict}"
        )
    print(f"reference vectors: {rows[0]['reference_s'] if rows else 0:.1f}s (0: cached)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
