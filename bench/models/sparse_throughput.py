"""A SPLADE sparse embedder served on ``/embed_sparse`` vs ``SparseEncoder.encode`` per request.

A random-weight ``SparseEncoder`` folder is built in a temporary folder (a BERT of
``--layers`` layers ``--width`` wide, masked-LM head, MiniLM's 30,522-term tokenizer, its
output bias lowered so that a text keeps about 1% of the terms, a few hundred, as a trained
SPLADE model does). Two contenders, one after the other, on the same real texts (a seeded sample of
Python's reference manual's paragraphs):

1. **served**: ``batchserve serve --model FOLDER --backend torch``; ``--concurrency``
   connections each send one text per request (``--per-request N``: N texts; TEI's
   ``/embed_sparse``) as soon as the last is answered, so the batcher joins them into
   length-sorted sub-passes;
2. **encode**: in this process, ``SparseEncoder.encode(text)`` called once per text (what
   one request costs without a server), on as many torch threads as the server's passes
   use together (``workers x threads``), and on one thread (on a busy machine a pass of
   several threads waits for the slowest; the better of the two is the yardstick).

texts/s is texts over wall time, the best of ``--rounds``; the ratio is served over the
better encode. The served terms of the first texts are checked against encode's.

Run: ``python bench/models/sparse_throughput.py [--rounds 2] [--count 400] [--json]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from batchserve_testing.bench import batchserve

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.runtime import default_threads, default_workers
from batchserve.loadgen.texts import reference_paragraphs


def build_folder(root: Path, texts: list[str], *, layers: int, width: int) -> Path:
    """A random-weight SparseEncoder folder (Transformer of task fill-mask, SpladePooling)."""
    import torch
    from sentence_transformers import SparseEncoder
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from batchserve.engines.embeddings import builtin_path

    tokenizer = AutoTokenizer.from_pretrained(str(builtin_path()), local_files_only=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=max(1, width // 32),
        intermediate_size=width * 4,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    model.train(False)
    # The output bias set so that about 1% of a text's terms weigh something (a few
    # hundred, as a trained SPLADE model keeps), read off the model's logits on sample texts.
    sample = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**sample).logits
        logits.masked_fill_(sample["attention_mask"].unsqueeze(-1) == 0, float("-inf"))
        maxima = logits.amax(dim=1).flatten()
        cut = torch.quantile(maxima[:: max(1, maxima.numel() // 100_000)], 0.99)
        model.cls.predictions.bias.sub_(cut)
    bare = root / "bare"
    model.save_pretrained(str(bare))
    tokenizer.save_pretrained(str(bare))
    folder = root / "splade"
    SparseEncoder(str(bare), device="cpu").save(str(folder))
    return folder


def send(
    port: int, texts: list[str], concurrency: int, per_request: int = 1
) -> tuple[float, list[Any]]:
    """Texts per second, ``per_request`` texts a request over ``concurrency`` connections.

    Also each text's answer, in order.
    """
    answers: list[Any] = [None] * len(texts)
    pending = list(range(0, len(texts), per_request))[::-1]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            while True:
                with lock:
                    if not pending:
                        return
                    i = pending.pop()
                body = json.dumps({"inputs": texts[i : i + per_request]})
                conn.request("POST", "/embed_sparse", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
                answers[i] = data  # parsed after the clock stops: the client's cost
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
    parsed = [row for a in answers if a is not None for row in json.loads(a)]
    return len(texts) / wall, parsed


def encode_each(folder: Path, texts: list[str], threads: int) -> tuple[float, list[Any]]:
    """Texts per second of ``SparseEncoder.encode(text)`` once per text; each text's terms."""
    import torch
    from sentence_transformers import SparseEncoder

    torch.set_num_threads(threads)
    model = SparseEncoder(str(folder), device="cpu")
    model.encode(texts[0])  # loaded and warm
    rows = []
    t0 = time.perf_counter()
    for text in texts:
        rows.append(model.encode(text))
    wall = time.perf_counter() - t0
    return len(texts) / wall, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--count", type=int, default=400, help="texts sent")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16, help="connections")
    parser.add_argument("--per-request", type=int, default=1, help="texts a request")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()

    paragraphs = list(reference_paragraphs())
    random.Random(0).shuffle(paragraphs)
    texts = [paragraphs[i % len(paragraphs)] for i in range(args.count)]
    threads = default_threads()
    workers = default_workers("cpu", threads)
    served_rates: list[float] = []
    encode_rates: list[float] = []
    single_rates: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_folder(Path(tmp), texts[:16], layers=args.layers, width=args.width)
        flags = ["--model", str(folder), "--backend", "torch", "--threads", str(threads)]
        answers: list[Any] = []
        rows: list[Any] = []
        for r in range(args.rounds):
            with batchserve(flags) as served:
                send(served.port, texts[-32:], args.concurrency, args.per_request)  # warm
                rate, answers = send(served.port, texts, args.concurrency, args.per_request)
            served_rates.append(rate)
            print(f"[round {r + 1}] served: {rate:.1f} texts/s", file=sys.stderr)
            rate, rows = encode_each(folder, texts, workers * threads)
            encode_rates.append(rate)
            print(f"[round {r + 1}] encode: {rate:.1f} texts/s", file=sys.stderr)
            rate, _ = encode_each(folder, texts, 1)
            single_rates.append(rate)
            print(f"[round {r + 1}] encode, 1 thread: {rate:.1f} texts/s", file=sys.stderr)
        same = 0
        for terms, row in zip(answers[:50], rows[:50], strict=True):
            dense = row.to_dense()
            want = dense.nonzero().flatten().tolist()
            if [t["index"] for t in terms] == want:
                same += 1
    result = {
        "command": "python bench/models/sparse_throughput.py",
        "texts": len(texts),
        "model": f"random SPLADE, BERT {args.layers} layers x {args.width}, vocabulary 30522",
        "threads": threads,
        "workers": workers,
        "concurrency": args.concurrency,
        "per_request": args.per_request,
        "served_texts_per_s": round(max(served_rates), 1),
        "encode_texts_per_s": round(max(encode_rates), 1),
        "encode_1_thread_texts_per_s": round(max(single_rates), 1),
        "ratio": round(max(served_rates) / max(*encode_rates, *single_rates), 2),
        "same_terms_of_first_50": same,
        "mean_terms_per_text": round(sum(len(a) for a in answers) / max(1, len(answers)), 1),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"served {result['served_texts_per_s']} texts/s, encode per text "
            f"{result['encode_texts_per_s']} texts/s ({workers} x {threads} threads), "
            f"{result['encode_1_thread_texts_per_s']} (1 thread): "
            f"{result['ratio']}x; the first 50 texts' terms equal: {same}/50; "
            f"{result['mean_terms_per_text']} terms a text"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
