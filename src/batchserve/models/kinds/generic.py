"""Anything else: an imported batch function, served over KServe's tensors as it is.

Its items are whatever its function takes (no unit), its outputs whatever it returns; it
is not warmed up, and no engine runs it, so no gate judges one.
"""

from __future__ import annotations

from batchserve.models.kinds.activation import NONE
from batchserve.models.kinds.kind import Kind, Tensors

__all__ = ["GENERIC"]

GENERIC = Kind(
    name="generic",
    item=None,
    head=Tensors(),
    activation=NONE,
    routes=("POST /v2/models/{name}/infer",),
)
