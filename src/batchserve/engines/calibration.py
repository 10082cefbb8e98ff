"""The texts an embedding model's int8 and uint8 ranges are calibrated on, embedded once.

Theory of operation: :func:`calibrate` embeds :data:`STRIDE`-spaced texts of the shipped
quality set (``data/quality_set.json``: questions, keyword queries, sentences, passages
and long passages of many topics, and texts in other languages, code and log lines; never
downloaded) with the model's own batch function, the engine it serves on, with the
folder's default prompt as any request that names none. The vectors are the calibration
embeddings (:class:`~batchserve.models.quantize.Calibration`) whose per-dimension minimum
and maximum quantize every int8 and uint8 answer of that model, as
``quantize_embeddings(..., calibration_embeddings=...)`` does. It runs once per model, at
load, beside the warm-up (:mod:`batchserve.server.registry`): a second or two for MiniLM
on a CPU, well under one for a small folder.
"""

from __future__ import annotations

import functools

import numpy as np

from batchserve.models.kinds import Vector, apply_prompt
from batchserve.models.loader import LoadedModel
from batchserve.models.quantize import Calibration

__all__ = ["STRIDE", "calibrate", "calibration_texts"]

#: Every STRIDE-th text of the shipped set is calibrated on (131 of its 1,046 texts):
#: enough for stable ranges (sentence-transformers warns under 100), few enough to load fast.
STRIDE = 8


@functools.cache
def calibration_texts() -> tuple[str, ...]:
    """The calibration texts: every :data:`STRIDE`-th text of the shipped quality set."""
    from batchserve.engines.quality_set import load

    return load().texts[::STRIDE]


def calibrate(loaded: LoadedModel) -> Calibration | None:
    """``loaded``'s calibration, embedded by its own engine; None where it has none.

    Only a model on an engine with a vector head is calibrated (``minilm``, an embedding
    folder); a synthetic or imported model is not (its int8 and uint8 are refused, naming
    why). Blocks for the passes: call it off the event loop.
    """
    if loaded.on_engine is None or not isinstance(loaded.kind.head, Vector):
        return None
    texts = calibration_texts()
    items = apply_prompt(list(texts), loaded.prompts, None)
    vectors = np.asarray(loaded.fn(items), dtype=np.float32)
    return Calibration.of(
        vectors,
        f"{len(texts)} texts of the shipped quality set (every {STRIDE}th), embedded by the "
        "served engine with the default prompt",
    )
