"""The output dimensions a model folder declares it was trained for (Matryoshka).

A Matryoshka-trained embedder (``MatryoshkaLoss``) is trained so that the first N values
of its vector, renormalised, are a good vector of N dimensions, for the N it was trained
at. A prefix of a model that was not trained so, or at an N it was not trained at, is a
worse vector than a smaller model's: the server refuses such a ``dimensions`` unless the
operator allows any prefix (``--any-dimensions``; see
:mod:`batchserve.server.protocols.dimensions`).

What a folder declares, as vLLM reads it: ``config.json``'s ``matryoshka_dimensions`` (a
list of the dimensions allowed) and ``is_matryoshka`` (true: any prefix); and, as
sentence-transformers records it, ``config_sentence_transformers.json``'s ``truncate_dim``
(the dimension its author chose to encode at). The model's own dimension is always allowed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NONE_DECLARED", "Matryoshka", "declared"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Matryoshka:
    """The dimensions a folder declares.

    Attributes:
        dimensions: the dimensions it was trained at, ascending (its own not included
            unless it lists it); empty: none declared.
        any_prefix: it declares any prefix good (``is_matryoshka: true`` and no list).
    """

    dimensions: tuple[int, ...] = ()
    any_prefix: bool = False


#: A model that declares no dimension of its own: only its own dimension is accepted.
NONE_DECLARED = Matryoshka()


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ints(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value] if value > 0 else []
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return []


def declared(folder: Path) -> Matryoshka:
    """What ``folder`` declares (see the module docstring); nothing for a missing file."""
    config = _read(folder / "config.json")
    st = _read(folder / "config_sentence_transformers.json")
    dims = set(_ints(config.get("matryoshka_dimensions")))
    dims.update(_ints(st.get("truncate_dim")))
    any_prefix = config.get("is_matryoshka") is True and "matryoshka_dimensions" not in config
    return Matryoshka(dimensions=tuple(sorted(dims)), any_prefix=any_prefix)
