"""A tiny random-weight ColBERT folder as PyLate 1.6 saves it, for the ColBERT tests.

The zoo's two-layer 32-wide BERT (``tests/zoo.py``) with a 32 -> 16 projection, written by
:func:`batchserve_testing.colbert.write_folder`; :func:`reference` is PyLate's own model on
it (:func:`batchserve_testing.colbert.reference`, which says what it restores of
sentence-transformers 5.3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchserve_testing import colbert

__all__ = ["build", "reference"]


def build(root: Path, name: str = "colbert", **settings: Any) -> Path:
    """Write the folder under ``root``; ``settings`` override the harness's ``SETTINGS``."""
    import zoo

    spec = zoo.Spec(name=name, family="bert", layout="bare", window=512)
    tokenizer = zoo.tokenizer_of(spec)
    raw = root / f".{name}-bert"
    zoo.model_of(spec, tokenizer).eval().save_pretrained(str(raw))
    tokenizer.save_pretrained(str(raw))
    return colbert.write_folder(raw, root / name, dimension=16, **settings)


def reference(folder: Path) -> Any:
    """PyLate's ``ColBERT`` on ``folder``."""
    return colbert.reference(folder)
