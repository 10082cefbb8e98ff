"""The model contract: a function from a list of inputs to a list of outputs.

A batch model is any callable, sync or async, that takes a sequence of inputs and returns a
sequence of outputs of the **same length and same order**. A plain function qualifies; so
does an object with ``__call__``. A sync model runs in a worker thread (torch and
onnxruntime release the GIL), an async one on the event loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "AsyncBatchFn",
    "BatchFn",
    "Outputs",
    "SyncBatchFn",
    "is_async_model",
]

#: What a batch model returns: a sequence, or an array whose first axis is the batch.
Outputs: TypeAlias = Sequence[Any] | npt.NDArray[np.generic]
SyncBatchFn: TypeAlias = Callable[[Sequence[Any]], Outputs]
AsyncBatchFn: TypeAlias = Callable[[Sequence[Any]], Awaitable[Outputs]]
BatchFn: TypeAlias = SyncBatchFn | AsyncBatchFn


def is_async_model(model: object) -> bool:
    """Whether calling ``model`` returns an awaitable (an ``async def`` function or method)."""
    if inspect.iscoroutinefunction(model):
        return True
    call = getattr(model, "__call__", None)  # noqa: B004 - we want the bound method itself
    return call is not None and inspect.iscoroutinefunction(call)
