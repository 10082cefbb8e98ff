"""A synthetic model with the seed's cost shape: ``fixed_s + n * per_item_s`` per call."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

from batchserve.config import check_non_negative
from batchserve.errors import ConfigError

__all__ = ["SyntheticModel"]


class SyntheticModel:
    """Stands in for a GPU forward pass: a fixed cost per call plus a small cost per item.

    It sleeps, as a forward pass on an accelerator leaves the CPU free, and answers
    ``embedding(<input>)`` for each input, as the Go seed does; or, with ``dimension`` set,
    a deterministic unit vector of that many floats derived from the input's text, so it can
    stand in for an embedding model behind the HTTP protocols.

    Args:
        fixed_s: seconds paid once per call.
        per_item_s: seconds added by each input.
        dimension: length of the vector answered per input; None answers a string.

    Raises:
        ConfigError: a cost is negative or not a number, or ``dimension`` is not >= 1.
    """

    def __init__(
        self, fixed_s: float = 0.008, per_item_s: float = 0.00025, *, dimension: int | None = None
    ) -> None:
        self.fixed_s = check_non_negative("fixed_s", fixed_s)
        self.per_item_s = check_non_negative("per_item_s", per_item_s)
        if dimension is not None and (
            isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1
        ):
            raise ConfigError(f"dimension must be an integer >= 1, got {dimension!r}")
        self.dimension = dimension
        self.calls = 0

    def __call__(self, inputs: Sequence[object]) -> list[str] | list[list[float]]:
        """Sleep ``fixed_s + len(inputs) * per_item_s``; answer one output per input."""
        self.calls += 1
        delay = self.fixed_s + len(inputs) * self.per_item_s
        if delay > 0:
            time.sleep(delay)
        if self.dimension is None:
            return [f"embedding({x})" for x in inputs]
        return [_vector(str(x), self.dimension) for x in inputs]

    def __repr__(self) -> str:
        return (
            f"SyntheticModel(fixed_s={self.fixed_s}, per_item_s={self.per_item_s}, "
            f"dimension={self.dimension})"
        )


def _vector(text: str, dimension: int) -> list[float]:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=32).digest()
    raw = [(digest[i % 32] - 127.5) / 127.5 + (i // 32) * 1e-3 for i in range(dimension)]
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return [v / norm for v in raw]
