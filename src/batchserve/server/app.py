"""The application: its models, metrics and drain, and the verdict on a request's head.

Theory of operation
-------------------
:class:`App` owns the served models (each behind its own batcher), the metrics and the drain.
An inference request is an
:class:`~batchserve.server.exchange.Exchange`: the app opens it from the request's head
(:meth:`App.begin`), where everything that needs no body is decided and a refusal is
answered before the body is read: the app's verdict on the head (API key, media type,
declared length, the deadline from the wire, the model) is a value,
:class:`~batchserve.server.exchange.HeadVerdict`, that the exchange applies, adding its own
admission (drain, a passed deadline) and the batcher's verdict on one more item. The app
never assigns an exchange's fields. Three drivers carry exchanges
(:mod:`batchserve.server.transport`): the connection protocol
(:mod:`~batchserve.server.transport.httptools`), which runs them with no task per request,
the ASGI driver behind this app's ASGI entry point
(:mod:`~batchserve.server.transport.asgi`), which runs them for any ASGI server or
in-process client and serves every other route (health, metadata, metrics, docs:
:mod:`batchserve.server.routes`), and the gRPC transport
(:mod:`~batchserve.server.transport.grpc`). :meth:`App.inference_route` says which HTTP
requests are exchanges.

The deadline of a request is the tightest of its headers' (see
:mod:`batchserve.server.deadlines`) and KServe's ``parameters.timeout``, else the model's
default (``--timeout``), counted from the request's arrival (its first byte, when the
connection protocol saw it).

Draining (:meth:`App.begin_drain`, on SIGTERM): every new inference request is answered 503
``draining`` with Retry-After, ``/v2/health/ready`` turns 503, and :meth:`App.drain` waits
until every accepted input has been computed and its response sent, at most the drain
timeout.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from batchserve.batcher import BatchRecord
from batchserve.clock import Clock, MonotonicClock
from batchserve.engines.loader import load_model
from batchserve.models.kinds import Kind
from batchserve.models.loader import LoadedModel
from batchserve.policy import ClassConfig, WorkClass
from batchserve.server.deadlines import wire_deadline
from batchserve.server.exchange import Endpoint, Exchange, HeadVerdict, Reply
from batchserve.server.http import Head, authorize, check_body_type, check_length
from batchserve.server.ops.metrics import Metrics
from batchserve.server.protocols import triton
from batchserve.server.protocols.catalog import INFER_PATH, INFERENCE
from batchserve.server.registry import Registry, ServedModel
from batchserve.server.routes import Routes, model_path
from batchserve.server.settings import ServerSettings
from batchserve.server.tenancy import TenantKeys, header_class, wire_tenant
from batchserve.server.transport.asgi import AsgiDriver, Receive, Scope, Send

if TYPE_CHECKING:
    from batchserve.server.ops.tracing import Tracing

__all__ = ["App", "create_app"]

log = logging.getLogger("batchserve.server")


def create_app(
    settings: ServerSettings, *, loader: Callable[[str], LoadedModel] = load_model
) -> App:
    """Build the ASGI application for ``settings`` (models load on startup)."""
    return App(settings, loader=loader)


class App:
    """The batchserve application. See the module docstring.

    Args:
        settings: models, limits, API key, drain timeout.
        loader: turns a model SPEC into a model (tests pass their own).
        tracer: with ``settings.otel``, the OpenTelemetry tracer spans go to (default: see
            :func:`batchserve.server.ops.tracing.default_tracer`).
        clock: the server's one clock (default: monotonic time): every batcher's, the
            transports' (a request's arrival) and the exchanges'. Tests pass a
            :class:`~batchserve.clock.ManualClock`.

    Use as an ASGI app under uvicorn (the lifespan protocol loads the models), or directly:
    ``async with App(settings) as app: await app.wait_ready()``.
    """

    def __init__(
        self,
        settings: ServerSettings,
        *,
        loader: Callable[[str], LoadedModel] = load_model,
        tracer: Any = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.limits = settings.limits
        self.metrics = Metrics()
        # Tracing off: plain exchanges, passes reported to the metrics alone (no cost).
        self.tracing: Tracing | None = None
        self._open_exchange: Callable[
            [Endpoint, Head, float, Callable[[Reply], None] | None], Exchange
        ] = functools.partial(Exchange, self)
        on_batch: Callable[[str, BatchRecord], None] = self.metrics.observe_batch
        if settings.otel:
            from batchserve.server.ops.tracing import TracedExchange, Tracing, default_tracer

            tracing = self.tracing = Tracing(tracer if tracer is not None else default_tracer())
            self._open_exchange = functools.partial(TracedExchange, self, tracing=tracing)
            observe = self.metrics.observe_batch

            def on_batch(name: str, record: BatchRecord) -> None:
                observe(name, record)
                tracing.on_batch(name, record)

        self.registry = Registry(
            [
                ServedModel(m, on_batch=on_batch, loader=loader, clock=self.clock)
                for m in settings.models
            ]
        )
        for m in self.registry.models.values():
            self.metrics.add_model(
                m.name,
                _stats_of(m),
                _ready_of(m),
                config=m.settings.batch,
                timeout_s=m.settings.timeout_s,
                kind=_kind_of(m),
            )
            if m.classes is not None:
                self.metrics.add_classes(m.name, _class_stats_of(m))
        self.draining = False
        self.started_unix = time.time()
        self._key = settings.api_key.encode() if settings.api_key else None
        # None unless tenant keys are configured: then a request's key names its tenant.
        self._tenant_keys = (
            TenantKeys(settings.tenant_keys, settings.api_key) if settings.tenant_keys else None
        )
        self._load_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Future[None] | None = None
        self._inflight = 0
        self._idle: asyncio.Event | None = None
        # The inference routes (one table: protocols.catalog), each path's endpoint built
        # once; KServe's infer is found by the path's shape.
        endpoints = {r.path: (r.method, r.endpoint(self.registry, self.limits)) for r in INFERENCE}
        self._infer = endpoints.pop(INFER_PATH)
        self._endpoints = endpoints
        # With one model, an OpenAI request can only be for it: refusals need no body.
        self._only = self.registry.default if len(self.registry.models) == 1 else None
        # The verdicts of a head that states no deadline and names no tenant (most heads),
        # built once: the path's model, and the one model a body may name.
        self._named = {n: HeadVerdict(m, True) for n, m in self.registry.models.items()}
        self._guessed = HeadVerdict(self._only, False)
        self._secured = self._key is not None or self._tenant_keys is not None
        self.routes = Routes(self, secured=self._secured)
        self._asgi = AsgiDriver(self)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start loading the models in the background (inference answers 503 meanwhile)."""
        if self._load_task is None:
            self._load_task = asyncio.get_running_loop().create_task(self.registry.load_all())

    async def wait_ready(self) -> None:
        """Block until every model serves; raise the load error if one failed."""
        await self.start()
        assert self._load_task is not None
        await asyncio.shield(self._load_task)

    def begin_drain(self) -> None:
        """Stop admitting: new inference requests get 503 ``draining``."""
        self.draining = True

    async def drain(self, timeout_s: float | None = None) -> None:
        """Finish every accepted input and send its response, at most ``timeout_s`` seconds.

        Inputs still queued when the time is up are answered 503 ``draining``. A second call
        (SIGTERM's drain, then the lifespan's ``stop``) waits for the first instead of
        starting the clock again, so the drain timeout bounds the whole shutdown.
        """
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain(timeout_s))
        await asyncio.shield(self._drain_task)

    async def _drain(self, timeout_s: float | None) -> None:
        self.begin_drain()
        now = self.clock.now
        t0 = now()
        await self.registry.drain(timeout_s)
        left = None if timeout_s is None else max(0.1, timeout_s - (now() - t0))
        if self._inflight:
            self._idle = self._idle or asyncio.Event()
            try:
                await asyncio.wait_for(self._idle.wait(), left)
            except TimeoutError:
                log.warning("drain: %d responses still unsent at the timeout", self._inflight)

    async def stop(self) -> None:
        """Drain (bounded by the drain timeout) and stop loading."""
        await self.drain(self.settings.drain_timeout_s)
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()

    async def __aenter__(self) -> App:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def inflight(self) -> int:
        """Inference requests accepted and not yet answered."""
        return self._inflight

    # -- inference exchanges (both drivers) ------------------------------------------------

    def inference_route(self, method: str, path: str) -> tuple[Endpoint, str | None] | None:
        """The endpoint and model name (None: named by the body) of an inference request.

        None for every other request (other routes, other methods, unknown paths).
        """
        route = self._endpoints.get(path)
        if route is not None:
            return (route[1], None) if method == route[0] else None
        if path.endswith("/infer") and method == self._infer[0]:
            model = model_path(path)
            if model is not None and model[2] == ("infer",):
                name, version, _ = model
                if version not in (None, triton.VERSION) and name in self.registry.models:
                    # Not an exchange: Routes.resolve answers 404, naming the versions
                    # served (as gRPC's ModelInfer does); an unknown model's 404 is the
                    # exchange's, naming the models.
                    return None
                return self._infer[1], name
        return None

    def authorize(self, head: Head) -> str | None:
        """The tenant the request's key names (None: the server's own key, or no keys set).

        Raises:
            ApiError: 401 ``unauthorized`` when keys are set and it carries none of them.
        """
        tenant_keys = self._tenant_keys
        if tenant_keys is None:
            authorize(head, self._key)
            return None
        return tenant_keys.tenant(head)

    def begin(
        self,
        endpoint: Endpoint,
        model_name: str | None,
        head: Head,
        arrival: float,
        respond: Callable[[Reply], None] | None,
    ) -> Exchange:
        """Open an inference exchange from the request's head; it is counted received.

        Everything decidable without the body is decided here (:meth:`verdict`) and
        applied by the exchange (``Exchange.open``, which adds its own admission and the
        batcher's screening); a refusal is answered at once through ``respond`` (then
        ``exchange.done`` is True and its body is not to be read). Otherwise the driver
        reads the body and calls ``exchange.feed``.

        Args:
            endpoint: the protocol (from :meth:`inference_route`).
            model_name: the model named by the path, or None (named by the body).
            head: the request's headers that the server reads.
            arrival: when its first byte arrived (on :attr:`clock`).
            respond: called once with the reply (not for a client that leaves).
        """
        self.metrics.observe_received()
        self._inflight += 1
        exchange = self._open_exchange(endpoint, head, arrival, respond)
        now = self.clock.now()
        exchange.open(self.verdict(endpoint, model_name, head, arrival, now), now)
        return exchange

    def verdict(
        self, endpoint: Endpoint, model_name: str | None, head: Head, arrival: float, now: float
    ) -> HeadVerdict:
        """The application's verdict on a request's head, at ``now`` (see :class:`HeadVerdict`).

        The key (and the tenant it names), the model the path names, the media type, the
        declared length and the deadline the head's fields state. Draining, a passed
        deadline and the queue are the exchange's own admission (``Exchange.open``).
        """
        model = None
        try:
            tenant = self.authorize(head) if self._secured else None
            if model_name is not None:
                model = self.registry.require(model_name, param="name")
            check_body_type(head, endpoint.body_types)
            check_length(head, self.limits.max_body_bytes)
            deadline = wire_deadline(head, arrival, now)
        except Exception as exc:
            return HeadVerdict(model, True, refusal=exc)
        if model is None:
            model = self._only
            if deadline is None and tenant is None:
                return self._guessed  # the common case: one model, nothing on the wire
            return HeadVerdict(model, False, deadline, tenant)
        if deadline is None and tenant is None:
            return self._named[model.name]
        return HeadVerdict(model, True, deadline, tenant)

    def classify(
        self, head: Head, classes: ClassConfig, named: WorkClass | None, tenant: str | None
    ) -> tuple[WorkClass, str | None]:
        """The class and tenant of a request to a model with ``classes``.

        The class the body named (``named``) stands; else the ``X-Priority`` header's. The
        tenant is the one its key named (``tenant``), else (no tenant keys) the
        ``X-Tenant`` header's.

        Raises:
            ApiError: 422 for an unknown class or a bad header value.
        """
        work_class = named if named is not None else header_class(classes, head)
        if self._tenant_keys is None and tenant is None:
            tenant = wire_tenant(head)
        return work_class, tenant

    def release(self) -> None:
        """An exchange's reply was written (or its client left); see :meth:`drain`."""
        self._inflight -= 1
        if self._inflight == 0 and self._idle is not None:
            self._idle.set()

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        """The ASGI entry point (``http`` and ``lifespan``): see :class:`AsgiDriver`."""
        await self._asgi(scope, receive, send_fn)


def _stats_of(model: ServedModel) -> Callable[[], Any]:
    def stats() -> Any:
        return model.batcher.statistics() if model.batcher is not None else None

    return stats


def _class_stats_of(model: ServedModel) -> Callable[[], Any]:
    def stats() -> Any:
        b = model.batcher
        return None if b is None else (b.class_statistics(), b.class_depths())

    return stats


def _kind_of(model: ServedModel) -> Callable[[], Kind | None]:
    return lambda: model.loaded.kind if model.loaded is not None else None


def _ready_of(model: ServedModel) -> Callable[[], bool]:
    return lambda: model.ready
