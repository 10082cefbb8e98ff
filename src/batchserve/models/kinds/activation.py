"""What turns a model's logits into the scores a client reads: the one implementation.

A sequence classification model answers logits; what a client is sent by default is their
activation, as TEI and ``CrossEncoder.predict`` apply it: a reranker's one logit through a
sigmoid (a relevance in 0..1), a classifier's logits through a softmax (a probability per
label). A request may ask for the raw logits instead (``raw_scores``), or name the function
(Hugging Face's ``function_to_apply``: :data:`ACTIVATIONS`).

Each activation works on the last axis of an array of any shape: one item's logits, or a
pass's ``[N, labels]`` (KServe's output tensor), in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ACTIVATIONS", "NONE", "SIGMOID", "SOFTMAX", "Activation"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Activation:
    """A function from logits to scores, over the last axis.

    Attributes:
        name: ``sigmoid``, ``softmax`` or ``none`` (Hugging Face's ``function_to_apply``).
        fn: the function, on a float64 array.
    """

    name: str
    fn: Callable[[Floats], Floats]

    def __call__(self, logits: Any) -> Floats:
        """The scores of ``logits`` (an array, or anything numpy reads as one), in float64."""
        return self.fn(np.asarray(logits, dtype=np.float64))


def _sigmoid(x: Floats) -> Floats:
    # exp(-x) overflows below -709; the sigmoid there is 0 to a double's precision.
    safe = np.maximum(x, -700.0)
    return np.where(x > -700.0, 1.0 / (1.0 + np.exp(-safe)), 0.0)


def _softmax(x: Floats) -> Floats:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    out: Floats = shifted / shifted.sum(axis=-1, keepdims=True)
    return out


def _none(x: Floats) -> Floats:
    return x


#: Each logit on its own, to 0..1: a reranker's relevance.
SIGMOID = Activation(name="sigmoid", fn=_sigmoid)
#: The logits of one item to probabilities that sum to 1: a classifier's labels.
SOFTMAX = Activation(name="softmax", fn=_softmax)
#: The logits as they are (``raw_scores``; an embedder's vector).
NONE = Activation(name="none", fn=_none)
#: Every activation by its name, as Hugging Face's ``function_to_apply`` names them.
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (SIGMOID, SOFTMAX, NONE)}
