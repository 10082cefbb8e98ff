"""A ColBERT model served (``/embed_all``) vs PyLate's ``encode`` called one text at a time.

The folder: the built-in MiniLM's transformer (6 layers, 384 wide) with a random 384 ->
128 projection and PyLate's default lengths (queries 32, documents 180 tokens), written
as PyLate 1.6 saves a ColBERT folder (:mod:`batchserve_testing.colbert`). Two contenders,
one after the other, on the same real texts (a seeded sample of Python's reference
manual's paragraphs, encoded as documents):

1. **served**: ``batchserve serve --model FOLDER`` (torch, the kind's only engine), sent
   ``/embed_all`` requests of ``--per-request`` texts over as many connections as its
   workers, each sending its next request when the last is answered;
2. **pylate**: in this process, ``ColBERT.encode([text], is_query=False)`` once per text,
   on as many torch threads as the server's passes use together (``workers x threads``).

Printed: texts/s and kept token vectors/s of each, and their ratio. Every served text's
vector count is checked against PyLate's.

Run: ``python bench/models/colbert_throughput.py [--texts 256] [--per-request 32]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.embeddings import builtin_path
from batchserve.engines.runtime import default_threads, default_workers
from batchserve.loadgen.texts import reference_paragraphs
from batchserve_testing.bench import batchserve
from batchserve_testing.colbert import reference, write_folder


def served(port: int, texts: list[str], per_request: int, connections: int) -> list[int]:
    """Each text's kept token vectors, over ``connections`` closed-loop connections."""
    requests = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
    counts: list[list[int]] = [[] for _ in requests]
    pending = list(range(len(requests)))[::-1]
    lock = threading.Lock()
    refused = [0]

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while True:
            with lock:
                if not pending:
                    break
                i = pending.pop()
            body = json.dumps({"inputs": requests[i]})
            while True:
                conn.request("POST", "/embed_all", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
                if response.status not in (429, 503):
                    break
                # Refused at admission (past what it predicts it can finish in time):
                # sent again after its Retry-After, as a client does.
                refused[0] += 1
                time.sleep(float(response.getheader("Retry-After") or 1))
            if response.status != 200:
                raise RuntimeError(f"/embed_all answered {response.status}: {data[:200]!r}")
            counts[i] = [len(vectors) for vectors in json.loads(data)]
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if refused[0]:
        print(f"requests refused and sent again: {refused[0]}")
    return [n for chunk in counts for n in chunk]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--per-request", type=int, default=32)
    args = parser.parse_args()
    import torch
    from transformers import AutoModel, AutoTokenizer

    threads = default_threads()
    workers = default_workers("cpu", threads)
    texts = random.Random(1).sample(list(reference_paragraphs()), args.texts)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "minilm"
        AutoModel.from_pretrained(str(builtin_path())).save_pretrained(str(raw))
        AutoTokenizer.from_pretrained(str(builtin_path())).save_pretrained(str(raw))
        folder = write_folder(
            raw, Path(tmp) / "colbert-minilm", dimension=128, query_length=32,
            document_length=180,
        )  # fmt: skip
        flags = ["--model", f"colbert={folder}", "--threads", str(threads)]
        with batchserve(flags) as server:
            served(server.port, texts[: args.per_request], args.per_request, 1)  # warm
            t0 = time.perf_counter()
            counts = served(server.port, texts, args.per_request, workers)
            served_s = time.perf_counter() - t0
        torch.set_num_threads(workers * threads)
        model = reference(folder)
        model.encode([texts[0]], is_query=False)  # warm
        t0 = time.perf_counter()
        want = [len(model.encode([t], is_query=False)[0]) for t in texts]
        pylate_s = time.perf_counter() - t0
    if counts != want:
        raise SystemExit("served token counts differ from PyLate's")
    vectors = sum(counts)
    print(f"texts {len(texts)}, token vectors {vectors}, threads {workers} x {threads}")
    for name, seconds in (("served /embed_all", served_s), ("pylate encode per text", pylate_s)):
        rate = f"{len(texts) / seconds:8.1f} texts/s  {vectors / seconds:9.0f} vectors/s"
        print(f"{name:24s}{rate}")
    print(f"served / pylate: {pylate_s / served_s:.2f}x")


if __name__ == "__main__":
    main()
