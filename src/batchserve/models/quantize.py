"""Quantized embeddings: float vectors as int8, uint8, binary or ubinary, calibrated once.

Theory of operation: the types are Cohere's ``embedding_types`` and sentence-transformers'
``quantize_embeddings`` precisions, computed as ``quantize_embeddings`` computes them
(``sentence_transformers/util/quantization.py``), step for step, so the bytes are equal:

* ``int8`` and ``uint8``: each dimension's range is the minimum and maximum of that
  dimension over a set of calibration embeddings (float32); its step is the range / 255
  (a zero step read as 1); a value becomes ``floor((x - min) / step)`` clipped to 0..255,
  which is the ``uint8`` value, and that less 128 the ``int8`` value. A value beyond the
  calibration's range is clipped to its end.
* ``binary`` and ``ubinary``: one bit per dimension, set where the value is > 0, packed
  eight to a byte, first dimension in the highest bit (``np.packbits``): the byte is the
  ``ubinary`` value, and that less 128 (as a signed byte) the ``binary`` value. A vector of
  ``d`` dimensions packs into ``ceil(d / 8)`` bytes, the last padded with zero bits.
* ``float``: the vector as it is.

``quantize_embeddings`` without calibration embeddings calibrates on the batch it is given,
so a vector's bytes would depend on the texts it was sent with; a server must not. The
ranges here come from a fixed calibration set embedded once per model at load
(:class:`Calibration`; the server embeds the shipped texts with the served engine itself),
so a text's bytes are the same whatever it is batched with, and equal
``quantize_embeddings(vectors, precision, calibration_embeddings=calibration.embeddings)``.

A request that cuts or scales its vectors (``dimensions``) is quantized on ranges of the
calibration embeddings cut and scaled the same way (:meth:`Calibration.ranges`), so the
ranges describe the vectors they quantize.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, get_args

import numpy as np
import numpy.typing as npt

__all__ = ["PRECISIONS", "QUANTIZED", "Calibration", "Precision", "quantize", "ranges_of"]

#: An embedding type: Cohere's name for it (``float`` is sentence-transformers' ``float32``).
Precision: TypeAlias = Literal["float", "int8", "uint8", "binary", "ubinary"]
#: Every embedding type, in Cohere's order.
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
#: The types that need calibration ranges.
QUANTIZED: frozenset[str] = frozenset({"int8", "uint8"})

Floats: TypeAlias = npt.NDArray[np.float32]


def ranges_of(calibration: npt.ArrayLike) -> Floats:
    """Each dimension's minimum and maximum over ``calibration`` (rows), shape ``(2, dim)``."""
    arr = np.asarray(calibration, dtype=np.float32)
    return np.vstack((np.min(arr, axis=0), np.max(arr, axis=0))).astype(np.float32, copy=False)


def quantize(
    embeddings: npt.ArrayLike, precision: Precision, ranges: Floats | None = None
) -> npt.NDArray[np.generic]:
    """``embeddings`` (rows, float32) as ``precision``, as ``quantize_embeddings`` makes them.

    Args:
        embeddings: the float vectors, one row each.
        precision: the type to make.
        ranges: ``int8``/``uint8``'s per-dimension minimum and maximum (:func:`ranges_of`
            of the calibration embeddings); unused by the other types.

    Raises:
        ValueError: ``int8``/``uint8`` without ranges, or ranges of another width.
    """
    arr = np.asarray(embeddings, dtype=np.float32)
    if precision == "float":
        return arr
    if precision == "binary":
        return (np.packbits(arr > 0, axis=-1) - 128).astype(np.int8)
    if precision == "ubinary":
        return np.packbits(arr > 0, axis=-1)
    if ranges is None or ranges.shape[-1] != arr.shape[-1]:
        raise ValueError(f"{precision} needs calibration ranges of the vectors' width")
    starts = ranges[0, :]
    steps = (ranges[1, :] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    values = np.clip(np.floor((arr - starts) / steps), 0, 255)
    if precision == "uint8":
        return values.astype(np.uint8)
    return (values - 128).astype(np.int8)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Calibration:
    """A model's calibration embeddings, and the ranges read from them.

    Attributes:
        embeddings: the calibration texts' vectors as the model serves them (rows, float32).
        source: what the texts were, in words (``/status`` and the manual say it).
    """

    embeddings: Floats
    source: str
    _ranges: dict[Hashable, Floats] = field(default_factory=dict, repr=False)

    def ranges(
        self, key: Hashable = None, transform: Callable[[Floats], Floats] | None = None
    ) -> Floats:
        """The ranges of the embeddings through ``transform`` (None: as they are).

        Args:
            key: names ``transform`` (the same key must mean the same transform): the
                ranges are computed once per key.
            transform: what a request does to its vectors (cut to ``dimensions``, scaled),
                done to the calibration embeddings so the ranges describe the vectors
                they quantize.
        """
        known = self._ranges.get(key)
        if known is None:
            rows = self.embeddings if transform is None else transform(self.embeddings)
            known = self._ranges[key] = ranges_of(rows)
        return known

    @classmethod
    def of(cls, embeddings: npt.ArrayLike, source: str) -> Calibration:
        """A calibration of ``embeddings`` (rows)."""
        arr = np.ascontiguousarray(np.asarray(embeddings, dtype=np.float32))
        if arr.ndim != 2 or not arr.shape[0]:
            raise ValueError(f"calibration embeddings must be rows of vectors, got {arr.shape}")
        return cls(embeddings=arr, source=source)
