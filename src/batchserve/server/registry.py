"""The served models, each with its own batcher, settings and readiness.

Theory of operation: a :class:`ServedModel` starts ``loading``; :meth:`ServedModel.load`
loads its SPEC in a thread (seconds for MiniLM), warms it up, and builds its
:class:`~batchserve.batcher.Batcher`, then it is ``ready``. While loading, every inference
request is answered ``not_ready`` (503, Retry-After); a model that failed to load stays
``failed`` and the server stops. The warm-up of an embedding model also measures one pass of
1 and of a few texts, so the batcher's cost model (and deadline-aware admission) starts from
this machine's figures instead of from zero (with its kind's warm-up item: a reranker's a
pair, a classifier's a text); a synthetic model states its cost exactly. An embedder on an
engine is first calibrated for its quantized answers (:mod:`batchserve.engines.calibration`).

:meth:`ServedModel.deadline_for` is a request's deadline when the wire states none: its
class's default, else the model's. A request's inputs are offered to the batcher by its
:class:`~batchserve.server.exchange.Exchange`, each as its own item.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from batchserve.batcher import Batcher, BatchRecord
from batchserve.clock import Clock, MonotonicClock
from batchserve.config import BatchConfig, CostEstimate
from batchserve.engines.calibration import calibrate
from batchserve.engines.loader import load_model
from batchserve.errors import NotReady
from batchserve.models.base import is_async_model
from batchserve.models.loader import LoadedModel
from batchserve.server.settings import ModelSettings
from batchserve.server.statuses import ApiError

__all__ = ["Registry", "ServedModel"]


class ServedModel:
    """One model behind its own batcher.

    Args:
        settings: name, SPEC, batcher settings and default deadline.
        on_batch: called with the model name and each finished pass's record (metrics).
        loader: turns a SPEC into a model (the default loads it for real).
        clock: the server's clock, its batcher's (default: monotonic time).
    """

    def __init__(
        self,
        settings: ModelSettings,
        *,
        on_batch: Callable[[str, BatchRecord], None] | None = None,
        loader: Callable[[str], LoadedModel] = load_model,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.name = settings.name
        #: Its classes of work (None: one FIFO queue).
        self.classes = settings.classes
        self.state = "loading"
        self.loaded: LoadedModel | None = None
        self.batcher: Batcher[Any] | None = None
        self.error: BaseException | None = None
        self.load_seconds: float | None = None
        self._on_batch = on_batch
        self._loader = loader
        self._started = self.clock.now()

    @property
    def ready(self) -> bool:
        """Whether the model serves."""
        return self.state == "ready"

    async def load(self) -> None:
        """Load, warm up and start the batcher; on failure record the error and re-raise."""
        try:
            loaded = await asyncio.to_thread(self._load_and_warm)
        except BaseException as exc:
            self.state = "failed"
            self.error = exc
            raise
        self.loaded = loaded
        config = self.settings.batch
        if self.settings.auto_workers and loaded.workers is not None:
            config = dataclasses.replace(config, workers=loaded.workers)
        if loaded.initial_cost is not None and config.initial_cost == CostEstimate(
            fixed_s=0.0, per_item_s=0.0
        ):
            config = dataclasses.replace(config, initial_cost=loaded.initial_cost)
        on_batch = self._on_batch
        name = self.name
        self.batcher = Batcher(
            loaded.fn,
            config,
            timeout_s=self.settings.timeout_s,
            on_batch=(lambda rec: on_batch(name, rec)) if on_batch is not None else None,
            classes=self.classes,
            clock=self.clock,
        )
        self.load_seconds = self.clock.now() - self._started
        self.state = "ready"

    def _load_and_warm(self) -> LoadedModel:
        loaded = self._loader(self.settings.spec)
        calibration = calibrate(loaded)  # an embedder on an engine: its int8/uint8 ranges
        if calibration is not None:
            loaded = dataclasses.replace(loaded, calibration=calibration)
        warm: Any = loaded.kind.warmup
        if warm is None or loaded.initial_cost is not None:
            return loaded
        fn: Any = loaded.fn
        if is_async_model(fn):
            return loaded
        fn([warm])
        k = max(2, min(8, self.settings.batch.max_batch_size))
        t0 = time.perf_counter()
        fn([warm])
        t1 = time.perf_counter()
        fn([warm] * k)
        t2 = time.perf_counter()
        one, many = t1 - t0, t2 - t1
        per_item = max(0.0, (many - one) / (k - 1))
        fixed = max(0.0, one - per_item)
        return dataclasses.replace(
            loaded, initial_cost=CostEstimate(fixed_s=fixed, per_item_s=per_item)
        )

    @property
    def config(self) -> BatchConfig:
        """The batcher's settings in force.

        The settings' own until the model has loaded; then with what the model decided (its
        workers, its initial cost).
        """
        return self.batcher.config if self.batcher is not None else self.settings.batch

    def require_batcher(self) -> Batcher[Any]:
        """The batcher, or raise NotReady while the model loads (or failed to)."""
        if self.batcher is None:
            waited = self.clock.now() - self._started
            raise NotReady(
                f"model {self.name!r} is {self.state} ({waited:.1f}s so far)",
                retry_after_s=1.0,
            )
        return self.batcher

    def deadline_for(self, timeout_s: float | None, start: float) -> float:
        """The absolute deadline of a request that arrived at ``start`` (batcher clock)."""
        return start + (timeout_s if timeout_s is not None else self.settings.timeout_s)


class Registry:
    """The served models by name; the first is the default.

    Args:
        models: one :class:`ServedModel` per name, in order.
    """

    def __init__(self, models: Sequence[ServedModel]) -> None:
        self.models: dict[str, ServedModel] = {m.name: m for m in models}
        self.default = models[0]

    def get(self, name: str | None) -> ServedModel | None:
        """The model called ``name`` (the default for None), or None if there is none."""
        if name is None:
            return self.default
        return self.models.get(name)

    def require(self, name: str | None, param: str = "model") -> ServedModel:
        """The model called ``name`` (the default for None).

        Raises:
            ApiError: ``not_found`` naming the models served here.
        """
        model = self.get(name)
        if model is None:
            known = ", ".join(self.models)
            raise ApiError(
                "not_found", f"model {name!r} is not served here; served: {known}", param=param
            )
        return model

    @property
    def ready(self) -> bool:
        """Whether every model serves."""
        return all(m.ready for m in self.models.values())

    async def load_all(self) -> None:
        """Load every model, one after another (they share the CPUs)."""
        for m in self.models.values():
            await m.load()

    async def drain(self, timeout_s: float | None) -> None:
        """Finish every accepted item of every model, at most ``timeout_s`` seconds."""
        batchers = [m.batcher for m in self.models.values() if m.batcher is not None]
        await asyncio.gather(*(b.shutdown(drain=True, timeout_s=timeout_s) for b in batchers))
