"""A text's tokens before truncation, by a model folder's own tokenizer.

The routes refuse a text over the model's window when asked not to truncate it
(``truncate: false``), and say which texts were cut (``X-Truncated-Inputs``): both need a
text's length before the window cuts it. An engine that counts it itself
(``untruncated_tokens``, as :class:`~batchserve.engines.sequence.SequenceClassifier` does)
is asked; :class:`FolderTokens` counts for one that does not, with a tokenizer of its own
read from the folder as the exported engines read it (``tokenizer.json`` and the rest at the
folder's root, ``do_lower_case`` from ``sentence_bert_config.json``).

Thread-safety: a fast tokenizer keeps state between calls, so calls hold a lock; the
tokenizer is this object's own, so no engine's pass ever waits for it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["FolderTokens"]


class FolderTokens:
    """Tokens per text before truncation (special tokens included), as a callable.

    Args:
        folder: the model folder.

    Raises:
        ImportError: transformers is missing (the ``embeddings`` extra).
    """

    def __init__(self, folder: Path) -> None:
        from transformers import AutoTokenizer

        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        config = folder / "sentence_bert_config.json"
        settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
        self._lower = bool(settings.get("do_lower_case", False))
        self._lock = threading.Lock()

    def __call__(self, texts: Sequence[Any]) -> list[int]:
        """Each text's tokens before truncation, in order (a non-string counts 0)."""
        batch = [t.lower() if self._lower else t for t in texts if isinstance(t, str)]
        if not batch:
            return [0] * len(texts)
        with self._lock:
            ids = self._tokenizer(batch, add_special_tokens=True)["input_ids"]
        counts = iter(len(row) for row in ids)
        return [next(counts) if isinstance(t, str) else 0 for t in texts]
