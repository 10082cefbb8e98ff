"""The engine ``--backend auto`` picks, served, against torch float32 served: same texts.

Two real ``batchserve serve`` processes, one after the other (never at once), alternating
over ``--rounds``:

1. **auto**: the server as ``scripts/serve`` runs it, with no engine flag (``--backend
   auto``): its verdict is read from the cache in ``--cache-dir``, or measured on its first
   start there (the start's seconds are reported);
2. **torch**: the same server pinned to the reference, ``--backend torch --dtype float32``.

Each is sent the same real texts (``--texts FILE``, one per line; default: the shipped
quality set's texts, queries and passages, 1,249 of every length) in requests of
``--per-request`` texts (32), one after another on one kept-alive connection, as a batch
job sends them: texts/s is texts over wall time, the best round kept for each. Then the
quality gate on those texts: the cosine of auto's answer to torch's for each text (mean
and min) and, with the shipped set, the nearest passage of each query kept, and whether
those pass the server's own quality gate.

Run: ``.venv/bin/python bench/served_engines.py [--rounds 3] [--json]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from batchserve_testing.bench import batchserve

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.quality import MIN_MEAN_COSINE, MIN_RANKING_AGREEMENT, nearest
from batchserve.engines.quality_set import load as load_quality_set

MODEL = "all-MiniLM-L6-v2"


def engine_of(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/status")
    status = json.loads(conn.getresponse().read())
    conn.close()
    engine: dict[str, Any] = status["models"][MODEL]["engine"]
    return engine


def send(port: int, texts: list[str], per_request: int) -> tuple[float, np.ndarray]:
    """Texts per second over all requests, and every embedding in order."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    rows: list[list[float]] = []
    t0 = time.perf_counter()
    for i in range(0, len(texts), per_request):
        body = json.dumps({"model": MODEL, "input": texts[i : i + per_request]})
        conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
        rows += [d["embedding"] for d in json.loads(data)["data"]]
    wall = time.perf_counter() - t0
    conn.close()
    return len(texts) / wall, np.asarray(rows, dtype=np.float32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument("--texts", help="a file of texts, one per line (default: shipped set)")
    parser.add_argument("--cache-dir", help="the servers' cache (default: the user's)")
    parser.add_argument("--auto-flags", default="", help="more flags for the auto server")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()

    qs = load_quality_set()
    if args.texts:
        texts = [t for t in Path(args.texts).read_text(encoding="utf-8").splitlines() if t]
        queries = 0
    else:
        texts = list(qs.texts) + list(qs.queries) + list(qs.passages)
        queries = len(qs.queries)
    env = {"BATCHSERVE_CACHE_DIR": args.cache_dir} if args.cache_dir else {}
    servers = {
        "auto": args.auto_flags.split(),
        "torch": ["--backend", "torch", "--dtype", "float32"],
    }
    rates: dict[str, list[float]] = {name: [] for name in servers}
    answers: dict[str, np.ndarray] = {}
    starts: dict[str, list[float]] = {name: [] for name in servers}
    engines: dict[str, dict[str, Any]] = {}
    for r in range(args.rounds):
        for name, flags in servers.items():
            t0 = time.perf_counter()
            with batchserve(flags, env=env) as served:
                starts[name].append(time.perf_counter() - t0)
                engines[name] = engine_of(served.port)
                rate, vectors = send(served.port, texts, args.per_request)
                rates[name].append(rate)
                answers[name] = vectors
            print(f"[round {r + 1}] {name}: {rate:.1f} texts/s", file=sys.stderr)
    auto, ref = answers["auto"], answers["torch"]
    cos = np.sum(auto * ref, axis=1) / (np.linalg.norm(auto, axis=1) * np.linalg.norm(ref, axis=1))
    kept = None
    if queries:
        n = len(qs.texts)
        q_ref = nearest(ref[n : n + queries], ref[n + queries :])
        q_auto = nearest(auto[n : n + queries], auto[n + queries :])
        kept = sum(a == b for a, b in zip(q_ref, q_auto, strict=True)) / queries
    best = {name: max(v) for name, v in rates.items()}
    choice = engines["auto"].get("choice") or {}
    result = {
        "texts": len(texts),
        "per_request": args.per_request,
        "rounds": args.rounds,
        "auto_engine": f"{engines['auto']['backend']}/{engines['auto']['precision']}",
        "auto_texts_per_s": round(best["auto"], 1),
        "torch_texts_per_s": round(best["torch"], 1),
        "speedup": round(best["auto"] / best["torch"], 3),
        "median_speedup": round(
            statistics.median(rates["auto"]) / statistics.median(rates["torch"]), 3
        ),
        "first_start_s": round(starts["auto"][0], 1),
        "later_start_s": round(statistics.median(starts["auto"][1:] or starts["auto"]), 1),
        "torch_start_s": round(statistics.median(starts["torch"]), 1),
        "verdict_measured_s": choice.get("seconds"),
        "mean_cosine": round(float(cos.mean()), 5),
        "min_cosine": round(float(cos.min()), 5),
        "ranking_agreement": None if kept is None else round(kept, 4),
        "gate": bool(
            cos.mean() >= MIN_MEAN_COSINE and (kept is None or kept >= MIN_RANKING_AGREEMENT)
        ),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    for key, value in result.items():
        print(f"{key:20} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
