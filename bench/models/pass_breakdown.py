"""Where one forward pass of the built-in model spends its time: tokenize, forward, pool/normalize.

For each ``--spec`` (default: the ONNX int8 and torch float32 engines, one thread), batches
of ``--batch`` shipped texts (``--texts short``: the shortest of the shipped set, as
queries are; ``mixed``: across the whole length range, grouped by length as the server
groups them) are run stage by stage, ``--repeats`` times, and each stage's share of the
pass is printed with its milliseconds per batch. The stages are the engine's own code, not
a copy: the tokenizer call the engine makes, the engine's forward (for torch, the
transformer and pooling modules, as ``SentenceEmbedder.embed`` runs them), and the
normalization and copy out.

What it answers: how much of a pass could leave the critical path if it ran beside the
previous pass (tokenizing the next batch while the current one runs), once the forward is
cheap. The answering (JSON encoding on the event loop) is measured per request by
``bench/request_cpu.py``.

``--pad-multiple 16`` also runs the exported engines with each batch's length padded up to
a multiple of 16 tokens (shape buckets), to see whether fewer distinct shapes pay for the
extra tokens.

Run: ``.venv/bin/python bench/pass_breakdown.py [--texts short] [--batch 32]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchserve.engines.embeddings import SentenceEmbedder
from batchserve.engines.exported import ExportedEmbedder, _feeds
from batchserve.engines.loader import load_model
from batchserve.engines.quality_set import load as load_quality_set


def bucketed(fn: ExportedEmbedder, batch: list[str], multiple: int) -> dict[str, Any]:
    """The engine's feeds with the length padded up to a multiple of ``multiple`` tokens."""
    enc = fn._tokenizer(
        [t.strip() for t in batch],
        padding=True,
        truncation="longest_first",
        max_length=fn.max_seq_length,
        return_tensors="np",
        pad_to_multiple_of=multiple,
    )
    return {n: np.asarray(enc[n], dtype=np.int64) for n in fn._inputs}


def stages(fn: Any, batch: list[str], multiple: int = 0) -> tuple[float, float, float]:
    """Seconds of tokenize, forward and normalize for one pass of ``fn`` on ``batch``."""
    t0 = time.perf_counter()
    if isinstance(fn, ExportedEmbedder):
        if multiple:
            feeds = bucketed(fn, batch, multiple)
        else:
            feeds, _ = _feeds(fn._tokenizer, batch, fn._inputs, fn.max_seq_length)
        t1 = time.perf_counter()
        out = np.asarray(fn._run(feeds), dtype=np.float32)
    elif isinstance(fn, SentenceEmbedder):
        import torch

        features = fn._preprocess(batch)
        t1 = time.perf_counter()
        with torch.inference_mode(), fn._precision():
            out = fn._model(features)["sentence_embedding"].float().numpy()
    else:
        raise TypeError(f"not an engine of the built-in model: {type(fn).__name__}")
    t2 = time.perf_counter()
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.ascontiguousarray(out / np.maximum(norms, 1e-12), dtype=np.float32)
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec",
        action="append",
        default=[],
        help="a minilm SPEC (repeatable; default: onnx-int8 and torch, one thread)",
    )
    parser.add_argument("--texts", choices=["short", "mixed"], default="mixed")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8, help="batches per repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--pad-multiple",
        type=int,
        default=0,
        help="also run ONNX Runtime/OpenVINO with lengths padded to a multiple of N tokens "
        "(shape buckets), beside the plain padding",
    )
    args = parser.parse_args()
    specs = args.spec or ["minilm:backend=onnx-int8,threads=1", "minilm:backend=torch,threads=1"]
    ordered = sorted(load_quality_set().texts, key=len)
    if args.texts == "short":
        pool = ordered[: args.batch * args.batches]
    else:
        step = max(1, len(ordered) // (args.batch * args.batches))
        pool = ordered[::step][: args.batch * args.batches]
    batches = [pool[i : i + args.batch] for i in range(0, len(pool), args.batch)]
    print(f"{'spec':40} {'tokenize':>14} {'forward':>15} {'normalize':>12}")
    for spec in specs:
        fn = load_model(spec).fn
        fn(batches[0][:2])
        multiples = [0]
        if args.pad_multiple and isinstance(fn, ExportedEmbedder):
            multiples.append(args.pad_multiple)
        totals = {m: np.zeros(3) for m in multiples}
        for _ in range(args.repeats):
            for m in multiples:  # alternated, so a neighbour's load falls on both alike
                for batch in batches:
                    totals[m] += stages(fn, batch, m)
        for m, total in totals.items():
            per = total / (args.repeats * len(batches)) * 1e3
            share = total / total.sum() * 100
            name = spec + (f" (pad to x{m})" if m else "")
            print(
                f"{name:40} {per[0]:6.1f}ms {share[0]:5.1f}% {per[1]:7.1f}ms {share[1]:5.1f}% "
                f"{per[2]:5.2f}ms {share[2]:4.1f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
