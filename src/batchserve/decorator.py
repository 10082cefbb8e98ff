"""``@batched``: turn a function over a list into an async function called per item.

Like Ray Serve's ``@serve.batch``: the decorated function takes a list of inputs and returns
a list of outputs of the same length and order; callers await it with one input each, and
calls that arrive close together run as one batch::

    @batched(max_batch_size=32, max_wait_s=0.002)
    def embed(texts: list[str]) -> list[list[float]]: ...

    vector = await embed("hello")

It works on methods too (one batcher per instance). A :class:`~batchserve.batcher.Batcher` is
created lazily per event loop on the first call; ``statistics()`` and ``aclose()`` reach the
current loop's batcher.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, Generic, overload

from typing_extensions import TypeVar

from batchserve.batcher import Batcher
from batchserve.config import BatchConfig
from batchserve.errors import ConfigError
from batchserve.policy import PolicyStats

__all__ = ["BatchedFunction", "batched"]

Out = TypeVar("Out", default=Any)


class BatchedFunction(Generic[Out]):
    """An async callable that batches its calls; made by :func:`batched`.

    Args:
        fn: the function over a list (sync or async).
        config: batching settings.
        timeout_s: default per-call deadline in seconds (None: none).
    """

    def __init__(
        self, fn: Callable[..., Any], config: BatchConfig, timeout_s: float | None
    ) -> None:
        self._fn = fn
        self._config = config
        self._timeout_s = timeout_s
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Batcher[Out]] = (
            weakref.WeakKeyDictionary()
        )
        self._attr = f"_batched_{id(self)}"
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "batched")

    def _batcher(self) -> Batcher[Out]:
        loop = asyncio.get_running_loop()
        b = self._batchers.get(loop)
        if b is None or b.closed:
            b = Batcher(self._fn, self._config, timeout_s=self._timeout_s)
            self._batchers[loop] = b
        return b

    async def __call__(self, item: Any, *, timeout_s: float | None = None) -> Out:
        """Submit one input and wait for its output (see :meth:`Batcher.submit`)."""
        return await self._batcher().submit(item, timeout_s=timeout_s)

    def statistics(self) -> PolicyStats:
        """The current event loop's batcher statistics."""
        return self._batcher().statistics()

    async def aclose(self) -> None:
        """Drain and close the current event loop's batcher."""
        loop = asyncio.get_running_loop()
        b = self._batchers.pop(loop, None)
        if b is not None:
            await b.shutdown()

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> BatchedFunction[Out]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> BatchedFunction[Out]: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> BatchedFunction[Out]:
        if instance is None:
            return self
        bound: BatchedFunction[Out] | None = instance.__dict__.get(self._attr)
        if bound is None:
            method = self._fn.__get__(instance, owner)
            bound = BatchedFunction(method, self._config, self._timeout_s)
            instance.__dict__[self._attr] = bound
        return bound


def batched(
    *,
    max_batch_size: int = 32,
    max_wait_s: float = 0.002,
    queue_size: int = 1024,
    workers: int = 1,
    admission: bool = True,
    timeout_s: float | None = None,
) -> Callable[[Callable[..., Any]], BatchedFunction[Any]]:
    """Decorate a function over a list so that it is awaited once per item.

    Args:
        max_batch_size: most items per call of the function.
        max_wait_s: how long the oldest waiting item may wait for others.
        queue_size: most items waiting; one more raises QueueFull at once.
        workers: calls of a sync function that may run at once (threads).
        admission: refuse at once items predicted to miss their deadline.
        timeout_s: default deadline per call, in seconds.

    Raises:
        ConfigError: a setting breaks its rule (raised at decoration time).
    """
    config = BatchConfig(
        max_batch_size=max_batch_size,
        max_wait_s=max_wait_s,
        queue_size=queue_size,
        workers=workers,
        admission=admission,
    )

    def wrap(fn: Callable[..., Any]) -> BatchedFunction[Any]:
        if not callable(fn):
            raise ConfigError(f"@batched must decorate a callable, got {fn!r}")
        return BatchedFunction(fn, config, timeout_s)

    return wrap
