"""The embedding types a route answers in: float, or quantized on the model's calibration.

Cohere's ``embedding_types`` (``/v2/embed``, ``/v1/embed``) and batchserve's
``embedding_type`` extension of OpenAI's ``/v1/embeddings`` and TEI's ``/embed`` answer
vectors as :mod:`batchserve.models.quantize` makes them. int8 and uint8 need the model's
calibration (:attr:`~batchserve.models.loader.LoadedModel.calibration`, embedded at load
by the served engine); a model without one (a synthetic or imported model) refuses them
before anything is queued (:func:`require_calibration`). The vectors are quantized after
their pass, when the answer is written: a request's rows at once (a few microseconds for
a hundred vectors, so on the event loop, as the JSON is written).

A route that cuts or scales its vectors (``dimensions``, TEI's ``normalize``) quantizes
them on the ranges of the calibration embeddings cut and scaled by the same function
(:func:`typed`), so the ranges describe the vectors they quantize.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.models.loader import LoadedModel
from batchserve.models.quantize import QUANTIZED, Precision, quantize
from batchserve.server.statuses import ApiError

__all__ = ["Transform", "require_calibration", "typed"]

#: A route's transform of its vectors (rows in, rows out), applied to the calibration too.
Transform = Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]


def require_calibration(loaded: LoadedModel, types: Iterable[str], field: str) -> None:
    """Refuse int8 or uint8 of a model that was not calibrated.

    Raises:
        ApiError: ``invalid`` naming ``field`` and why.
    """
    if loaded.calibration is not None:
        return
    for kind in types:
        if kind in QUANTIZED:
            raise ApiError(
                "invalid",
                f"{field} {kind!r} needs the model's calibration ranges, and this model has "
                "none (only a model on an engine, minilm or a folder, is calibrated at load); "
                "float, binary and ubinary need none",
                param=field,
            )


def typed(
    loaded: LoadedModel,
    vectors: npt.NDArray[np.float32],
    precision: Precision,
    *,
    key: Hashable = None,
    transform: Transform | None = None,
) -> npt.NDArray[Any]:
    """``vectors`` (rows, as the route sends them) as ``precision``.

    Args:
        loaded: the model (its calibration, for int8 and uint8).
        vectors: the route's vectors, after ``transform``.
        precision: the type.
        key: names ``transform`` (the ranges are computed once per model and key).
        transform: what the route did to the model's vectors (None: nothing).
    """
    ranges = None
    if precision in QUANTIZED:
        calibration = loaded.calibration
        assert calibration is not None  # require_calibration refused it at parse time
        ranges = calibration.ranges(key, transform)
    return quantize(vectors, precision, ranges)
