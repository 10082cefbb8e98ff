"""A model's arithmetic beside the machine's: FLOPs a token, a matrix product's rate.

An encoder's work per token is mostly its linear layers: in each layer the attention's four
``d x d`` projections (query, key, value, output) and the feed-forward's two ``d x f``
layers, a multiply and an add per weight. :attr:`Shape.flops_per_token` counts those,
``2 * layers * (4 d^2 + 2 d f)``, and nothing else: attention's own products (``QK^T``,
``AV``) grow with a text's length and are left to whoever counts them, embeddings are
lookups, and the rest (layer norms, activations, pooling) is small beside them.

:func:`matmul_rate` is the machine's side: torch's matrix product at the model's shapes
(``tokens x d @ d x f``, the feed-forward's first layer over a pass of ``tokens``), the best
of repeated runs, on a given number of threads. A served pass's useful FLOPs a second over
that rate is how close it comes to the arithmetic the machine does at its best on the same
shapes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Shape", "matmul_rate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """An encoder's shape, as its ``config.json`` states it.

    Attributes:
        layers: transformer layers (``num_hidden_layers``).
        width: hidden width ``d`` (``hidden_size``).
        ffn: feed-forward width ``f`` (``intermediate_size``).
    """

    layers: int
    width: int
    ffn: int

    @classmethod
    def of(cls, folder: Path) -> Shape:
        """The shape in ``folder/config.json`` (a transformers or sentence-transformers folder).

        Raises:
            OSError: there is no config.json.
            KeyError: it lacks one of the three fields.
        """
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        return cls(
            layers=int(config["num_hidden_layers"]),
            width=int(config["hidden_size"]),
            ffn=int(config["intermediate_size"]),
        )

    @property
    def flops_per_token(self) -> int:
        """The linear layers' FLOPs for one token: ``2 * layers * (4 d^2 + 2 d f)``."""
        d, f = self.width, self.ffn
        return 2 * self.layers * (4 * d * d + 2 * d * f)

    def describe(self) -> str:
        """The count in words, with its figures."""
        return (
            f"{self.layers} layers x (4 x {self.width}^2 + 2 x {self.width} x {self.ffn}) "
            f"weights x 2 = {self.flops_per_token / 1e6:.1f} MFLOP a token"
        )


def matmul_rate(
    shape: Shape,
    threads: int,
    *,
    dtype: str = "float32",
    tokens: int = 2048,
    seconds: float = 1.0,
) -> float:
    """Torch's matrix product ``tokens x d @ d x f`` in GFLOP/s: the best of ``seconds``.

    Runs in this process on ``threads`` threads (:func:`torch.set_num_threads`, which
    stays set); after three products not timed, groups of four are timed until ``seconds``
    passed, and the fastest group counts.

    Args:
        shape: the model's widths.
        threads: torch's intra-op threads.
        dtype: a torch dtype's name (``float32``, ``bfloat16``).
        tokens: the rows, a pass's tokens.
        seconds: how long to repeat.
    """
    import torch

    torch.set_num_threads(threads)
    kind = getattr(torch, dtype)
    a = torch.randn(tokens, shape.width).to(kind)
    b = torch.randn(shape.width, shape.ffn).to(kind)
    flops = 2 * tokens * shape.width * shape.ffn
    for _ in range(3):
        torch.matmul(a, b)
    best = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(4):
            torch.matmul(a, b)
        best = max(best, 4 * flops / (time.perf_counter() - t0))
    return best / 1e9
