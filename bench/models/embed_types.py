"""Cohere's ``/v2/embed`` served per embedding type: what quantizing adds to a request.

``batchserve serve`` (the built-in MiniLM on ``--backend``, torch by default, or
``--model``) is sent the same requests of ``--texts`` texts each (32: the shipped quality
set's texts, its realistic length mix) by ``--concurrency`` clients (2) on kept-alive
connections, once per type of ``--types`` (``float``, ``int8``, ``ubinary``), in
alternating rounds (``--rounds``, 3) so the machine's noise falls on each alike. It prints
each type's median texts/s and its ratio to ``float``'s, and every round's figures. The
quantizing itself (a request's rows at once, after the pass) is a few microseconds per
request; what the figures show beside the pass is the answer's size (an int8 vector is
written as small integers, a ubinary one in an eighth of the values).

Run: ``python bench/models/embed_types.py [--rounds 3] [--requests 12] [--backend torch]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from batchserve.engines.quality_set import load
from batchserve_testing.bench import batchserve


def _round(url: str, requests: list[list[str]], kind: str, concurrency: int) -> float:
    # Texts per second over wall time, every answer checked whole.
    def send(client: httpx.Client, texts: list[str]) -> int:
        r = client.post(f"{url}/v2/embed", json={"texts": texts, "embedding_types": [kind]})
        r.raise_for_status()
        rows = r.json()["embeddings"][kind]
        if len(rows) != len(texts):
            raise RuntimeError(f"{kind}: {len(rows)} vectors for {len(texts)} texts")
        return len(rows)

    clients = [httpx.Client(timeout=300) for _ in range(concurrency)]
    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            done = sum(
                pool.map(
                    lambda i: send(clients[i % concurrency], requests[i]), range(len(requests))
                )
            )
        return done / (time.perf_counter() - start)
    finally:
        for client in clients:
            client.close()


def main() -> None:
    """Measure and print (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="the SPEC served")
    parser.add_argument("--backend", default="torch", help="the engine served")
    parser.add_argument("--types", default="float,int8,ubinary", help="the types compared")
    parser.add_argument("--texts", type=int, default=32, help="texts per request")
    parser.add_argument("--requests", type=int, default=12, help="requests per round and type")
    parser.add_argument("--concurrency", type=int, default=2, help="clients at once")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every type")
    args = parser.parse_args()
    kinds = args.types.split(",")
    texts = list(load().texts)
    requests = [
        [texts[(i * args.texts + k) % len(texts)] for k in range(args.texts)]
        for i in range(args.requests)
    ]
    flags = ["--model", args.model, "--backend", args.backend, "--max-wait", "2ms"]
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    with batchserve(flags) as server:
        _round(server.url, requests[:2], "float", args.concurrency)  # warm the connections
        for _ in range(args.rounds):
            for kind in kinds:
                rates[kind].append(_round(server.url, requests, kind, args.concurrency))
    base = statistics.median(rates[kinds[0]])
    print(
        f"{args.model} on {args.backend}: {args.texts} texts a request, {args.concurrency} clients"
    )
    for kind in kinds:
        median = statistics.median(rates[kind])
        runs = ", ".join(f"{r:.0f}" for r in rates[kind])
        print(f"  {kind:8s} {median:7.1f} texts/s  x{median / base:.2f} of {kinds[0]}  ({runs})")


if __name__ == "__main__":
    main()
