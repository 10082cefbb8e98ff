"""An LLM reranker served, beside its model card's recipe called one pair at a time in-process.

The bench builds its own folder unless ``--model`` names one: a random-weight
``Qwen3ForCausalLM`` of ``--layers`` (4) decoder layers ``--width`` (256) wide, with a
byte-level BPE tokenizer trained on the shipped texts and ``batchserve_reranker.json``
naming the ``qwen3`` template (``batchserve_testing.llm_reranker``): Qwen3-Reranker's shape
at a size a shared CPU measures in seconds. Its scores mean nothing, but cost what the
shape costs.

Requests are one query and ``--passages`` (32) passages of the shipped quality set, cycled.
Two ways to score the same pairs:

* **yardstick**: the model card's recipe with transformers (the prompt, ``tokenizer`` then
  ``pad``, the whole model's logits, ``log_softmax`` over no and yes), called once per pair
  in this process, as the card shows it, at the torch threads the server uses (its threads
  per pass x its workers, as ``/status`` reports them);
* **served**: ``batchserve serve --model FOLDER`` (``--backend auto``: torch, the one
  engine for the kind), sent the requests' ``POST /rerank`` by ``--concurrency`` (2)
  clients on kept-alive connections; pairs/s over wall time.

The first request's served scores are compared with the recipe's (the largest difference
of P(yes)), and the two are measured in ``--rounds`` alternating rounds (medians).

Run: ``python bench/models/llm_rerank_throughput.py [--rounds 1] [--requests 6] [--json]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from batchserve_testing import encode_alone, llm_reranker
from batchserve_testing.bench import batchserve

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.quality_set import load as load_quality_set

#: A rerank request: the query and its passages.
Request = tuple[str, list[str]]


def requests_of(n: int, passages: int) -> list[Request]:
    """``n`` requests of one query and ``passages`` passages of the quality set."""
    qs = load_quality_set()
    texts = list(qs.texts)
    out = []
    for i in range(n):
        start = (i * passages) % len(texts)
        out.append(
            (
                qs.queries[i % len(qs.queries)],
                [texts[(start + j) % len(texts)] for j in range(passages)],
            )
        )
    return out


def served_scores(port: int, request: Request) -> list[float]:
    """The P(yes) the server's ``/rerank`` gives each passage of ``request``, in order."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"query": request[0], "texts": request[1]})
    conn.request("POST", "/rerank", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")
    by_index = {int(r["index"]): float(r["score"]) for r in json.loads(data)}
    return [by_index[i] for i in range(len(request[1]))]


def closed_loop(port: int, requests: list[Request], concurrency: int) -> float:
    """Pairs per second of ``concurrency`` clients sending ``requests`` once, kept alive."""
    bodies = [json.dumps({"query": q, "texts": d}).encode() for q, d in requests]
    todo = list(range(len(bodies)))
    lock = threading.Lock()
    errors: list[str] = []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        while True:
            with lock:
                if not todo or errors:
                    break
                body = bodies[todo.pop()]
            conn.request("POST", "/rerank", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                errors.append(f"HTTP {resp.status}: {data[:300]!r}")
        conn.close()

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


def get_json(port: int, path: str) -> Any:
    """GET ``path`` on 127.0.0.1:``port`` as JSON."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
        return json.loads(resp.read())


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Every figure of the run (see the module's docstring)."""
    requests = requests_of(args.requests, args.passages)
    reference = llm_reranker.Reference(folder)

    def recipe(pairs: list[Any]) -> object:
        return [reference(q, d) for q, d in pairs]

    batches = [[(q, d) for d in docs] for q, docs in requests]
    figures: dict[str, Any] = {
        "folder": str(folder) if args.model else f"random Qwen3 {args.layers}x{args.width}",
        "passages_per_request": args.passages,
        "requests_per_round": args.requests,
        "concurrency": args.concurrency,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    with batchserve(["--model", str(folder), "--timeout", "600s"]) as server:
        _name, model = next(iter(get_json(server.port, "/status")["models"].items()))
        engine = model["engine"]
        threads = int(engine["threads"]) * int(model["settings"]["workers"])
        figures["served_engine"] = {k: engine[k] for k in ("backend", "precision", "threads")}
        figures["workers"] = model["settings"]["workers"]
        figures["yardstick_threads"] = threads
        first = requests[0]
        got = served_scores(server.port, first)
        want = [reference(first[0], d) for d in first[1]]
        figures["max_score_difference"] = max(abs(a - b) for a, b in zip(got, want, strict=True))
        rounds: dict[str, list[float]] = {"yardstick": [], "served": []}
        for _ in range(args.rounds):
            rounds["yardstick"].append(
                encode_alone.rate(recipe, batches, warm=1, threads=threads).items_per_s
            )
            rounds["served"].append(closed_loop(server.port, requests, args.concurrency))
    figures["rounds"] = rounds
    figures["yardstick_pairs_per_s"] = statistics.median(rounds["yardstick"])
    figures["served_pairs_per_s"] = statistics.median(rounds["served"])
    figures["ratio"] = figures["served_pairs_per_s"] / figures["yardstick_pairs_per_s"]
    return figures


def main() -> int:
    """Parse the flags, build the folder, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--model", help="an LLM reranker folder (default: build a random one)")
    parser.add_argument("--width", type=int, default=256, help="the built model's hidden size")
    parser.add_argument("--layers", type=int, default=4, help="the built model's layers")
    parser.add_argument("--requests", type=int, default=6, help="requests per round")
    parser.add_argument("--passages", type=int, default=32, help="passages per request")
    parser.add_argument("--concurrency", type=int, default=2, help="clients of the server")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds (medians)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            folder = Path(args.model)
        else:
            folder = llm_reranker.build(Path(tmp), width=args.width, layers=args.layers)
        figures = measure(args, folder)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    threads = figures["yardstick_threads"]
    print(f"LLM reranker ({figures['folder']}), {args.passages} passages a request")
    print(
        f"  the card's recipe, one pair at a time, {threads} threads: "
        f"{figures['yardstick_pairs_per_s']:.1f} pairs/s"
    )
    print(
        f"  served /rerank ({figures['served_engine']['backend']}, {figures['workers']} workers "
        f"x {figures['served_engine']['threads']} threads, {args.concurrency} clients): "
        f"{figures['served_pairs_per_s']:.1f} pairs/s"
    )
    print(f"  served / recipe: {figures['ratio']:.2f}x")
    print(
        f"  largest P(yes) difference on the first request: {figures['max_score_difference']:.2e}"
    )
    print(f"  rounds: {figures['rounds']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
