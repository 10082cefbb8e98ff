"""MiniLM served at saturation versus ``encode`` alone at its best batch size, side by side.

1. **encode alone**: in this process, ``SentenceTransformer.encode`` on batches of the same
   texts at several batch sizes; the best texts/s is the ceiling.
2. **served**: a real ``batchserve serve`` (MiniLM, ``--max-batch-size`` = that best size,
   otherwise its defaults: on two cores, two passes of one thread at once) in a subprocess,
   driven to saturation by a closed-loop raw HTTP/1.1 client in this process:
   ``--concurrency`` connections (default: a full batch per worker and one more), each
   sending the next single-text request as soon as the previous one is answered (and, as a
   second figure, requests of 8 texts each), so the queue always holds a full batch. Served
   texts/s over the measured window. ``--server-flags '--workers 1'`` serves with other
   flags, for an A/B run.

A full batch answers all its requests at once, so a window must hold many passes: on a
slow machine (tens of texts/s) use long windows (``--seconds``).

It prints served over encode's best, per round and their median. The two alternate
over ``--rounds`` rounds; the server idles while encode runs and vice versa. On this shared
2-core machine the client, the server's event loop and torch's threads compete for the same
cores: the figures are noisy and the client's own CPU is part of what the served figure
pays.

``--spec minilm:backend=onnx-int8,threads=1`` serves that SPEC and measures encode alone
on the same model as the server loads it (backend, threads), so the ratio compares like
with like.

Run: ``python bench/models/minilm_throughput.py [--rounds 2] [--seconds 8] [--spec S]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import statistics
import sys
import time
import urllib.request
from typing import Any

from batchserve_testing import encode_alone
from batchserve_testing.bench import batchserve

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = [
    "batching",
    "model",
    "server",
    "request",
    "queue",
    "deadline",
    "embedding",
    "sentence",
    "vector",
    "token",
    "latency",
    "throughput",
    "worker",
    "thread",
    "forward",
    "pass",
    "padding",
    "attention",
    "pooling",
    "normalize",
    "client",
    "answer",
    "the",
    "a",
    "of",
    "to",
    "in",
    "and",
    "for",
    "with",
    "on",
    "at",
    "by",
    "from",
]


def corpus(n: int = 512, seed: int = 7) -> list[str]:
    """Texts of 3 to 16 words (a spread of lengths, as short queries have), fixed by the seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 16))) for _ in range(n)]


def encode_rates(
    texts: list[str], sizes: list[int], seconds: float, spec: str = ""
) -> dict[int, float]:
    """Texts/s of encode alone per batch size (:mod:`batchserve_testing.encode_alone`):
    ``SentenceTransformer.encode``, or with ``spec`` the model as the server loads it (same
    backend, device and threads), on full batches that go round the texts."""
    if spec:
        from batchserve.engines.loader import load_model

        call: encode_alone.Call = _LOADED.get(spec) or _LOADED.setdefault(spec, load_model(spec).fn)
    else:
        call = encode_alone.encode(encode_alone.minilm())
    return {
        b: encode_alone.rate(call, encode_alone.windows(texts, b), seconds=seconds).items_per_s
        for b in sizes
    }


_LOADED: dict[str, Any] = {}


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> int:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    match = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    if match:
        await reader.readexactly(int(match.group(1)))
    return int(head[9:12])


async def served_rate(
    host: str, port: int, texts: list[str], per_request: int, concurrency: int, seconds: float
) -> tuple[float, int]:
    """Texts/s answered 200 over ``seconds`` after a 2 s warm-up; and non-200 answers."""
    counts = {"ok": 0, "bad": 0}
    measuring = asyncio.Event()
    stop = asyncio.Event()
    rng = random.Random(1)

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        while not stop.is_set():
            batch = [texts[rng.randrange(len(texts))] for _ in range(per_request)]
            body = json.dumps({"input": batch if per_request > 1 else batch[0]}).encode()
            request = (
                f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            status = await _exchange(reader, writer, request)
            if measuring.is_set() and not stop.is_set():
                counts["ok" if status == 200 else "bad"] += per_request if status == 200 else 1
        writer.close()

    tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    await asyncio.sleep(2.0)
    measuring.set()
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    stop.set()
    elapsed = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    return counts["ok"] / elapsed, counts["bad"]


def server_flags(max_batch_size: int, spec: str = "", flags: list[str] | None = None) -> list[str]:
    return [
        *(["--model", spec] if spec else []),
        "--max-batch-size", str(max_batch_size), "--max-wait", "5ms",
        "--queue-size", "4096", "--admission", "off", "--timeout", "60s", *(flags or []),
    ]  # fmt: skip


def server_workers(host: str, port: int) -> int:
    """The passes the server runs at once (``--workers``, or the model's own), once loaded."""
    for _ in range(600):
        with urllib.request.urlopen(f"http://{host}:{port}/status") as r:
            (model,) = json.loads(r.read())["models"].values()
        if model["state"] == "ready":
            return int(model["settings"]["workers"])
        time.sleep(0.1)
    raise RuntimeError("the server's model did not load in 60 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="per measurement")
    parser.add_argument("--batch", type=int, default=0, help="skip the sweep: this batch size")
    parser.add_argument("--sizes", default="1,4,8,16,32,64", help="encode batch sizes")
    parser.add_argument("--concurrency", type=int, default=0, help="default: 2x best batch")
    parser.add_argument(
        "--spec",
        default="",
        help="serve and encode this SPEC, e.g. minilm:backend=onnx-int8,threads=1 "
        "(default: serve minilm, encode with SentenceTransformer.encode)",
    )
    parser.add_argument(
        "--server-flags",
        default="",
        help="more serve flags, e.g. '--workers 1' (default: the server's own defaults)",
    )
    args = parser.parse_args()
    texts = corpus()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.batch:
        best = args.batch
    else:
        print("encode alone, texts/s by batch size (the best is the server's batch size):")
        first = encode_rates(texts, sizes, args.seconds / 2, args.spec)
        print("  " + "  ".join(f"b={b}: {r:6.1f}" for b, r in first.items()))
        best = max(first, key=lambda b: first[b])
    rows: list[dict[str, Any]] = []
    with batchserve(server_flags(best, args.spec, shlex.split(args.server_flags))) as served:
        host, port = served.host, served.port
        workers = server_workers(host, port)
        concurrency = args.concurrency or (workers + 1) * best
        print(f"server: {workers} worker(s), batch {best}")
        for r in range(args.rounds):
            ceiling = encode_rates(texts, [best], args.seconds, args.spec)[best]
            single, bad1 = asyncio.run(served_rate(host, port, texts, 1, concurrency, args.seconds))
            multi, bad8 = asyncio.run(
                served_rate(host, port, texts, 8, max(2, concurrency // 8 + 1), args.seconds)
            )
            rows.append({"encode": ceiling, "single": single, "multi": multi})
            print(
                f"round {r + 1}: encode b={best}: {ceiling:6.1f} texts/s | served, 1 text/request "
                f"x{concurrency} connections: {single:6.1f} texts/s ({single / ceiling:.0%}) | "
                f"served, 8 texts/request: {multi:6.1f} texts/s ({multi / ceiling:.0%})"
                + (f" | non-200: {bad1 + bad8}" if bad1 + bad8 else "")
            )
    # Paired rounds: each ratio compares windows seconds apart, so slow drifts of the
    # machine's load cancel better than in a ratio of means.
    single_ratio = statistics.median(r["single"] / r["encode"] for r in rows)
    multi_ratio = statistics.median(r["multi"] / r["encode"] for r in rows)
    enc = statistics.median(r["encode"] for r in rows)
    print(
        f"\nmedian over rounds: encode {enc:.1f} texts/s; served/encode {single_ratio:.0%} "
        f"(1 text/request) and {multi_ratio:.0%} (8 texts/request)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
