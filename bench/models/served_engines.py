"""The default engine served, torch float32 served, and encode() on each request: same texts.

Three contenders, one after the other (never at once), alternating over ``--rounds``:

1. **auto**: the server as ``scripts/serve`` runs it, with no engine flag (``--backend
   auto``): its verdict is read from the cache in ``--cache-dir``, or measured on its first
   start there (the start's seconds are reported);
2. **torch**: the same server pinned to the reference, ``--backend torch --dtype float32``;
3. **encode**: the yardstick, what a user gets without a server: in this process,
   ``SentenceTransformer.encode`` on each request's texts as one padded batch (torch
   float32, ``batch_size`` = the request's texts), on as many threads as the server's
   passes use together (``workers x threads``, all the cores by default).

Each is sent the same real texts (``--texts``: ``reference``, the default, a seeded sample
of 1,200 paragraphs of Python's reference manual
(:func:`batchserve.loadgen.texts.reference_paragraphs`), a long-tailed mix of 48 tokens
mean; ``shipped``, the shipped quality set's texts, queries
and passages; or a FILE, one text per line) in requests of ``--per-request`` texts (32),
as an indexer sends them: ``--concurrency`` connections (as many as the server's workers)
each sending its next request when the last is answered. texts/s is texts over wall time,
the best round kept for each. Then the ratios, and the quality of auto's answers against
torch's: the cosine per text (mean and min) and, with the shipped set, the nearest
passage of each query kept.

Run: ``python bench/models/served_engines.py [--rounds 3] [--json]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from batchserve_testing import encode_alone
from batchserve_testing.bench import batchserve

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.embeddings import builtin_path, load_sentence_transformer
from batchserve.engines.quality import MIN_MEAN_COSINE, MIN_RANKING_AGREEMENT, nearest
from batchserve.engines.quality_set import load as load_quality_set
from batchserve.engines.runtime import default_threads, default_workers
from batchserve.loadgen.texts import reference_paragraphs

MODEL = "all-MiniLM-L6-v2"


def engine_of(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/status")
    status = json.loads(conn.getresponse().read())
    conn.close()
    engine: dict[str, Any] = status["models"][MODEL]["engine"]
    return engine


def send(port: int, texts: list[str], per_request: int, concurrency: int) -> tuple[float, Any]:
    """Texts per second over all requests, and every embedding in order.

    ``concurrency`` connections each send the next request as soon as the last is answered;
    a refused one (429, 503: past saturation) is sent again after its ``Retry-After``.
    """
    requests = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
    answers: list[list[list[float]] | None] = [None] * len(requests)
    lock = threading.Lock()
    pending = list(range(len(requests)))[::-1]
    errors: list[BaseException] = []
    refused = [0]

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            while True:
                with lock:
                    if not pending:
                        return
                    i = pending.pop()
                body = json.dumps({"model": MODEL, "input": requests[i]})
                for _ in range(100):
                    conn.request(
                        "POST", "/v1/embeddings", body, {"Content-Type": "application/json"}
                    )
                    resp = conn.getresponse()
                    data = resp.read()
                    if resp.status not in (429, 503):
                        break
                    # Refused (past saturation): retry when the server says, as a client does.
                    with lock:
                        refused[0] += 1
                    time.sleep(min(float(resp.getheader("Retry-After") or 0.1), 2.0))
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
                answers[i] = [d["embedding"] for d in json.loads(data)["data"]]
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    clients = [threading.Thread(target=client) for _ in range(max(1, concurrency))]
    t0 = time.perf_counter()
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    rows = [row for answer in answers for row in answer or []]
    if refused[0]:
        print(f"  {refused[0]} refusals (429/503) retried", file=sys.stderr)
    return len(texts) / wall, np.asarray(rows, dtype=np.float32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument(
        "--texts",
        default="reference",
        help="reference (default: 1,200 paragraphs of Python's reference manual), shipped "
        "(the quality set), or a file of texts, one per line",
    )
    parser.add_argument("--count", type=int, default=1200, help="reference texts sent")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="connections (default: the workers)"
    )
    parser.add_argument(
        "--yardstick-threads",
        type=int,
        default=None,
        help="encode's torch threads (default: the server's workers x threads)",
    )
    parser.add_argument("--cache-dir", help="the servers' cache (default: the user's)")
    parser.add_argument("--auto-flags", default="", help="more flags for the auto server")
    parser.add_argument(
        "--flags", default="", help="more flags for both servers (e.g. '--threads 2 --workers 1')"
    )
    parser.add_argument(
        "--contenders",
        default="auto,torch,encode",
        help="which of auto, torch, encode to run (comma-separated; default: all three)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()

    qs = load_quality_set()
    queries = 0
    if args.texts == "reference":
        paragraphs = list(reference_paragraphs())
        random.Random(0).shuffle(paragraphs)
        texts = [paragraphs[i % len(paragraphs)] for i in range(args.count)]
    elif args.texts == "shipped":
        texts = list(qs.texts) + list(qs.queries) + list(qs.passages)
        queries = len(qs.queries)
    else:
        texts = [t for t in Path(args.texts).read_text(encoding="utf-8").splitlines() if t]
    threads = default_threads()
    workers = default_workers("cpu", threads)
    concurrency = args.concurrency or workers
    yardstick_threads = args.yardstick_threads or workers * threads
    st = load_sentence_transformer(builtin_path(), device="cpu")
    env = {"BATCHSERVE_CACHE_DIR": args.cache_dir} if args.cache_dir else {}
    wanted = set(args.contenders.split(","))
    servers = {
        name: flags + args.flags.split()
        for name, flags in {
            "auto": args.auto_flags.split(),
            "torch": ["--backend", "torch", "--dtype", "float32"],
        }.items()
        if name in wanted
    }
    rates: dict[str, list[float]] = {name: [] for name in [*servers, "encode"] if name in wanted}
    answers: dict[str, np.ndarray] = {}
    starts: dict[str, list[float]] = {name: [] for name in servers}
    engines: dict[str, dict[str, Any]] = {}
    for r in range(args.rounds):
        for name, flags in servers.items():
            t0 = time.perf_counter()
            with batchserve(flags, env=env) as served:
                starts[name].append(time.perf_counter() - t0)
                engines[name] = engine_of(served.port)
                # A few requests first: the engine's sub-pass cost is learned from them.
                warm = texts[-args.per_request * 4 :]
                send(served.port, warm, args.per_request, concurrency)
                rate, vectors = send(served.port, texts, args.per_request, concurrency)
                rates[name].append(rate)
                answers[name] = vectors
            print(f"[round {r + 1}] {name}: {rate:.1f} texts/s", file=sys.stderr)
        if "encode" not in wanted:
            continue
        # The yardstick: each request's texts as one padded batch, after one warm-up batch.
        batches = encode_alone.cut(texts, args.per_request)
        rate = encode_alone.rate(
            encode_alone.encode(st), batches, threads=yardstick_threads
        ).items_per_s
        rates["encode"].append(rate)
        print(f"[round {r + 1}] encode: {rate:.1f} texts/s", file=sys.stderr)
    best = {name: max(v) for name, v in rates.items()}
    result: dict[str, Any] = {
        "texts": len(texts),
        "per_request": args.per_request,
        "rounds": args.rounds,
        "concurrency": concurrency,
        "flags": args.flags,
        "encode_threads": yardstick_threads if "encode" in best else None,
    }
    if "auto" in engines:
        result["auto_engine"] = f"{engines['auto']['backend']}/{engines['auto']['precision']}"
    for name, rate in best.items():
        result[f"{name}_texts_per_s"] = round(rate, 1)
    if "encode" in best:
        for name in servers:
            result[f"{name}_vs_encode"] = round(best[name] / best["encode"], 3)
    for name in servers:
        result[f"{name}_start_s"] = round(statistics.median(starts[name]), 1)
    if "auto" in answers and "torch" in answers:
        auto, ref = answers["auto"], answers["torch"]
        cos = np.sum(auto * ref, axis=1) / (
            np.linalg.norm(auto, axis=1) * np.linalg.norm(ref, axis=1)
        )
        kept = None
        if queries:
            n = len(qs.texts)
            q_ref = nearest(ref[n : n + queries], ref[n + queries :])
            q_auto = nearest(auto[n : n + queries], auto[n + queries :])
            kept = sum(a == b for a, b in zip(q_ref, q_auto, strict=True)) / queries
        result["auto_vs_torch"] = round(best["auto"] / best["torch"], 3)
        result["median_auto_vs_torch"] = round(
            statistics.median(rates["auto"]) / statistics.median(rates["torch"]), 3
        )
        result["verdict_measured_s"] = (engines["auto"].get("choice") or {}).get("seconds")
        result["mean_cosine"] = round(float(cos.mean()), 5)
        result["min_cosine"] = round(float(cos.min()), 5)
        result["ranking_agreement"] = None if kept is None else round(kept, 4)
        result["gate"] = bool(
            cos.mean() >= MIN_MEAN_COSINE and (kept is None or kept >= MIN_RANKING_AGREEMENT)
        )
    if args.json:
        print(json.dumps(result))
        return 0
    for key, value in result.items():
        print(f"{key:26} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
