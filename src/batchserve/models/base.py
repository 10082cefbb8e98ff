"""The model contract: a function from a list of inputs to a list of outputs.

A batch model is any callable, sync or async, that takes a sequence of inputs and returns a
sequence of outputs of the **same length and same order**. A plain function qualifies; so
does an object with ``__call__``. A sync model runs in a worker thread (torch and
onnxruntime release the GIL), an async one on the event loop.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "AsyncBatchFn",
    "BatchFn",
    "EmbeddingEngine",
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


class EmbeddingEngine(Protocol):
    """What the server reads of an embedding model that runs on an engine.

    The engines of :mod:`batchserve.engines` (torch, ONNX Runtime, OpenVINO) state it, and
    :class:`~batchserve.models.loader.LoadedModel` carries it to the routes: ``/info``
    reports the pooling and the window, and a route that normalizes on request (TEI's
    ``normalize``) normalizes only what :attr:`normalized` says is not unit length already.

    Attributes:
        kind: ``embedding``.
        dimension: a vector's length.
        max_seq_length: the window in tokens; a longer text is truncated to it.
        pooling: the pooling its folder states (``mean``, ``cls``, ``max``, ``lasttoken``,
            ``weightedmean``, ``mean_sqrt_len_tokens``; several joined by ``+``).
        normalized: whether the vectors it returns are unit length: what the folder's own
            modules return (a ``Normalize`` module last), never normalized on top.
    """

    kind: str
    dimension: int
    max_seq_length: int
    pooling: str
    normalized: bool

    def __call__(self, texts: Sequence[str]) -> Outputs:
        """One vector per text, in order (see the module docstring)."""
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them (special tokens included, truncated)."""
        ...
