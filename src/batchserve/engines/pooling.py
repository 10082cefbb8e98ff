"""What a sentence-transformers folder's ``Pooling``, ``Dense`` and ``Normalize`` compute, in numpy.

The arithmetic of :class:`~batchserve.engines.pipeline.TextPipeline`'s last half, apart
from the reading of the folder: each pooling mode over a pass's token embeddings
(:func:`pool`), the pooling mask that keeps a prompt's tokens out (:func:`prompt_mask`),
and a ``Dense`` layer with the activations sentence-transformers loads
(:class:`DenseLayer`). Every engine's token embeddings go through it, so torch, ONNX
Runtime and OpenVINO pool with one code; float32 throughout, as the library computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.errors import ConfigError

__all__ = ["POOLING_MODES", "DenseLayer", "activation_name", "pool", "prompt_mask"]

#: The pooling modes sentence-transformers knows, in its order of concatenation.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")

_Array = npt.NDArray[Any]


def activation_name(module: Any) -> str:
    """The activation sentence-transformers loaded for a Dense module, as a name numpy runs.

    Raises:
        ConfigError: one batchserve does not run.
    """
    import torch

    names = {
        torch.nn.Tanh: "tanh",
        torch.nn.Identity: "identity",
        torch.nn.ReLU: "relu",
        torch.nn.Sigmoid: "sigmoid",
        torch.nn.SiLU: "silu",
    }
    for cls, name in names.items():
        if type(module) is cls:
            return name
    if type(module) is torch.nn.GELU:
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    raise ConfigError(
        f"the Dense module's activation {type(module).__name__} is not one batchserve runs "
        "(Tanh, Identity, ReLU, GELU, Sigmoid, SiLU)"
    )


def _activate(name: str, x: _Array) -> _Array:
    if name == "tanh":
        return np.tanh(x)
    if name == "relu":
        return np.maximum(x, 0)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "gelu":
        from math import sqrt

        erf = np.vectorize(_erf, otypes=[np.float64])
        return np.asarray(0.5 * x * (1.0 + erf(x / sqrt(2.0))), dtype=np.float32)
    if name == "gelu_tanh":
        inner = np.tanh(0.7978845608028654 * (x + 0.044715 * x**3))
        return np.asarray(0.5 * x * (1.0 + inner), dtype=np.float32)
    return x


def _erf(v: float) -> float:
    from math import erf

    return erf(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class DenseLayer:
    """A ``Dense`` module as numpy runs it: ``activation(x @ weight.T + bias)`` (+ residual).

    Attributes:
        weight: ``(out_features, in_features)``.
        bias: ``(out_features,)``, or None.
        activation: ``tanh``, ``identity``, ``relu``, ``sigmoid``, ``silu``, ``gelu``,
            ``gelu_tanh``.
        residual: the residual's projection ``(out, in)`` when the module adds one and the
            sizes differ; None otherwise.
        use_residual: add the input (or its projection) to the output.
    """

    weight: _Array
    bias: _Array | None
    activation: str
    residual: _Array | None = None
    use_residual: bool = False

    def __call__(self, x: _Array) -> _Array:
        """The layer's output for the rows ``x``."""
        out = x @ self.weight.T
        if self.bias is not None:
            out = out + self.bias
        out = _activate(self.activation, out)
        if self.use_residual:
            out = out + (x if self.residual is None else x @ self.residual.T)
        return np.asarray(out, dtype=np.float32)


def prompt_mask(attention: _Array, lengths: Sequence[int]) -> _Array:
    """The pooling mask: ``attention`` with each row's first ``lengths[i]`` real tokens zeroed.

    A row's real tokens start after its left padding, if any (sentence-transformers 6's
    ``Pooling._exclude_prompt_from_mask``, one prompt length per row).
    """
    mask = attention.copy()
    first = attention.argmax(axis=1)
    for row, n in enumerate(lengths):
        if n:
            mask[row, : int(first[row]) + n] = 0
    return mask


def pool(mode: str, tokens: _Array, attention: _Array, mask: _Array) -> _Array:
    """One pooling mode over token embeddings ``(items, width, hidden)``: ``(items, hidden)``.

    sentence-transformers 6's padded pooling (``Pooling._forward_padded``), mode by mode;
    ``mask`` is the pooling mask (the attention mask with any prompt's tokens zeroed).

    Raises:
        ConfigError: an unknown mode.
    """
    n, width, _ = tokens.shape
    m = mask.astype(np.float32)[:, :, None]
    rows = np.arange(n)
    if mode == "cls":
        return np.asarray(tokens[rows, mask.argmax(axis=1)], dtype=np.float32)
    if mode == "max":
        return np.asarray(np.where(m > 0, tokens, -np.inf).max(axis=1), dtype=np.float32)
    if mode in ("mean", "mean_sqrt_len_tokens"):
        total = (tokens * m).sum(axis=1, dtype=np.float32)
        count = np.maximum(m.sum(axis=1), 1e-9)
        return np.asarray(total / (count if mode == "mean" else np.sqrt(count)), np.float32)
    if mode == "weightedmean":
        positions = np.arange(1, width + 1, dtype=np.float32)[None, :]
        weights = (m[:, :, 0] * (positions - attention.argmax(axis=1)[:, None]))[:, :, None]
        total = (tokens * weights).sum(axis=1, dtype=np.float32)
        return np.asarray(total / np.maximum(weights.sum(axis=1), 1e-9), dtype=np.float32)
    if mode == "lasttoken":
        flipped = mask[:, ::-1]
        last = flipped.argmax(axis=1)
        last = np.where(flipped.max(axis=1) == 0, width - 1, last)
        return np.asarray((tokens * m)[rows, width - last - 1], dtype=np.float32)
    raise ConfigError(f"pooling mode must be one of {', '.join(POOLING_MODES)}, got {mode!r}")
