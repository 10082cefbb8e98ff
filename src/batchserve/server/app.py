"""The application: lifecycle, routes, inference exchanges, the ASGI driver, drain.

Theory of operation
-------------------
:class:`App` owns the served models (each behind its own batcher), the metrics and the
drain. An inference request is an :class:`~batchserve.server.exchange.Exchange`: the app
opens it from the request's head (:meth:`App.begin`), where everything that needs no body is
decided (API key, media type, declared length, the deadline from the wire, the model, drain,
readiness, and the batcher's verdict on one more item) and a refusal is answered before the
body is read. Two drivers carry exchanges: the connection protocol
(:mod:`batchserve.server.wire`), which runs them with no task per request, and this app's
ASGI entry point, which runs them for any ASGI server or in-process client and serves every
other route (health, metadata, metrics, docs). :meth:`App.inference_route` says which
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
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from batchserve.batcher import BatchRecord
from batchserve.models.loader import LoadedModel, load_model
from batchserve.policy import ClassConfig, WorkClass
from batchserve.server import kserve, openai, triton
from batchserve.server.asgi import (
    ClientGone,
    Head,
    Message,
    Receive,
    Scope,
    Send,
    authorize,
    check_body_type,
    check_length,
    json_bytes,
    load_json,
    read_body,
    read_head,
    send,
    watch_disconnect,
)
from batchserve.server.classes import TenantKeys, header_class, wire_tenant
from batchserve.server.dashboard import DASHBOARD_HEADERS, dashboard_html
from batchserve.server.deadlines import wire_deadline
from batchserve.server.exchange import ARRIVAL, Endpoint, Exchange, Reply, passed
from batchserve.server.metrics import CONTENT_TYPE, Metrics
from batchserve.server.openapi import docs_html, openapi_spec
from batchserve.server.registry import Registry, ServedModel
from batchserve.server.settings import ServerSettings
from batchserve.server.status import server_status
from batchserve.server.statuses import ApiError, from_exception

if TYPE_CHECKING:
    from batchserve.server.tracing import Tracing

__all__ = ["App", "create_app"]

log = logging.getLogger("batchserve.server")

Handler = Callable[..., Awaitable[None]]
_HTML = b"text/html; charset=utf-8"
#: The most a body to a route that is not inference may hold (the repository index's).
_SMALL_BODY = 64 * 1024


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
            :func:`batchserve.server.tracing.default_tracer`).

    Use as an ASGI app under uvicorn (the lifespan protocol loads the models), or directly:
    ``async with App(settings) as app: await app.wait_ready()``.
    """

    def __init__(
        self,
        settings: ServerSettings,
        *,
        loader: Callable[[str], LoadedModel] = load_model,
        tracer: Any = None,
    ) -> None:
        self.settings = settings
        self.limits = settings.limits
        self.metrics = Metrics()
        # Tracing off: plain exchanges, passes reported to the metrics alone (no cost).
        self.tracing: Tracing | None = None
        self._exchange_type: type[Exchange] = Exchange
        on_batch: Callable[[str, BatchRecord], None] = self.metrics.observe_batch
        if settings.otel:
            from batchserve.server.tracing import TracedExchange, Tracing, default_tracer

            tracing = self.tracing = Tracing(tracer if tracer is not None else default_tracer())
            self._exchange_type = TracedExchange
            observe = self.metrics.observe_batch

            def on_batch(name: str, record: BatchRecord) -> None:
                observe(name, record)
                tracing.on_batch(name, record)

        self.registry = Registry(
            [ServedModel(m, on_batch=on_batch, loader=loader) for m in settings.models]
        )
        for m in self.registry.models.values():
            self.metrics.add_model(
                m.name,
                _stats_of(m),
                _ready_of(m),
                config=m.settings.batch,
                timeout_s=m.settings.timeout_s,
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
        self._spec: bytes | None = None
        self._embeddings = openai.EmbeddingsEndpoint(self.registry, self.limits)
        self._infer = kserve.InferEndpoint(self.limits)
        # With one model, an OpenAI request can only be for it: refusals need no body.
        self._only = self.registry.default if len(self.registry.models) == 1 else None
        self._static = self._static_routes()
        self._model_routes: dict[tuple[str, ...], dict[str, Handler]] = {
            (): {"GET": self._kserve_model},
            ("ready",): {"GET": self._kserve_model_ready},
            ("config",): {"GET": self._triton_config},
            ("stats",): {"GET": self._triton_stats},
            ("infer",): {"POST": self._not_routed},
        }

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
        t0 = time.monotonic()
        await self.registry.drain(timeout_s)
        left = None if timeout_s is None else max(0.1, timeout_s - (time.monotonic() - t0))
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
        if method != "POST":
            return None
        if path == "/v1/embeddings":
            return self._embeddings, None
        if path.startswith("/v2/models/") and path.endswith("/infer"):
            parts = path[len("/v2/models/") :].split("/")
            if len(parts) == 2 or (len(parts) == 4 and parts[1] == "versions"):
                return self._infer, parts[0]
        return None

    def begin(
        self,
        endpoint: Endpoint,
        model_name: str | None,
        head: Head,
        arrival: float,
        respond: Callable[[Reply], None] | None,
    ) -> Exchange:
        """Open an inference exchange from the request's head; it is counted received.

        Everything decidable without the body is decided here, and a refusal is answered
        at once through ``respond`` (then ``exchange.done`` is True and its body is not to
        be read). Otherwise the driver reads the body and calls ``exchange.feed``.

        Args:
            endpoint: the protocol (from :meth:`inference_route`).
            model_name: the model named by the path, or None (named by the body).
            head: the request's headers that the server reads.
            arrival: when its first byte arrived (monotonic seconds).
            respond: called once with the reply (not for a client that leaves).
        """
        self.metrics.observe_received()
        self._inflight += 1
        exchange = self._exchange_type(self, endpoint, head, arrival, respond)
        try:
            tenant_keys = self._tenant_keys
            if tenant_keys is None:
                authorize(head, self._key)
            else:
                exchange.tenant = tenant_keys.tenant(head)
            model = self._only
            if model_name is not None:
                model = exchange.model = self.registry.require(model_name, param="name")
            if self.draining:
                exchange.model = model
                raise ApiError("draining", "the server is shutting down and admits no new requests")
            check_body_type(head, endpoint.body_types)
            check_length(head, self.limits.max_body_bytes)
            now = time.monotonic()
            deadline = exchange.deadline = wire_deadline(head, arrival, now)
            if model is None:
                return exchange
            exchange.model = model  # for the refusals below; the body confirms it
            if deadline is not None and deadline <= now:
                raise passed(now - arrival)
            batcher = model.require_batcher()
            classes = model.classes
            if classes is None:
                refusal = batcher.screen(
                    deadline if deadline is not None else arrival + model.settings.timeout_s
                )
            else:
                work_class = self.classify(exchange, classes)
                if deadline is None:
                    timeout_s = work_class.timeout_s
                    deadline = arrival + (
                        timeout_s if timeout_s is not None else model.settings.timeout_s
                    )
                refusal = batcher.screen(deadline, work_class.name, exchange.tenant)
            if refusal is not None:
                raise refusal
            if model_name is None:
                exchange.model = None
        except Exception as exc:
            exchange.fail(exc)
        return exchange

    def classify(self, exchange: Exchange, classes: ClassConfig) -> WorkClass:
        """The class and tenant of ``exchange`` for a model with ``classes`` (set on it).

        The class the body named stands; else the ``X-Priority`` header's. The tenant is
        the one its key named, else (no tenant keys) the ``X-Tenant`` header's.

        Raises:
            ApiError: 422 for an unknown class or a bad header value.
        """
        work_class = exchange.work_class
        if work_class is None:
            work_class = exchange.work_class = header_class(classes, exchange.head)
        if self._tenant_keys is None and exchange.tenant is None:
            exchange.tenant = wire_tenant(exchange.head)
        return work_class

    def release(self) -> None:
        """An exchange's reply was written (or its client left); see :meth:`drain`."""
        self._inflight -= 1
        if self._inflight == 0 and self._idle is not None:
            self._idle.set()

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        """The ASGI entry point (``http`` and ``lifespan``)."""
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send_fn)
        elif kind == "lifespan":
            await self._lifespan(receive, send_fn)

    async def _lifespan(self, receive: Receive, send_fn: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send_fn({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send_fn({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        path: str = scope["path"]
        send_fn = self._closing_when_draining(send_fn)
        try:
            route = self.inference_route(scope["method"], path)
            if route is not None:
                await self._exchange(scope, receive, send_fn, *route)
                return
            handler, args = self._route(scope["method"], path)
            await handler(scope, receive, send_fn, *args)
        except Exception as exc:
            error = from_exception(exc)
            if error.reason == "internal":
                log.exception("internal error on %s %s", scope["method"], path)
            await self._send_error(send_fn, path, error)

    async def _exchange(
        self,
        scope: Scope,
        receive: Receive,
        send_fn: Send,
        endpoint: Endpoint,
        model_name: str | None,
    ) -> None:
        """Carry one inference exchange over ASGI: head, body, answer, disconnects."""
        answered: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        arrival = scope.get("extensions", {}).get(ARRIVAL)
        head = read_head(scope["headers"])
        exchange = self.begin(
            endpoint,
            model_name,
            head,
            arrival if arrival is not None else time.monotonic(),
            answered.set_result,
        )
        try:
            if not exchange.done:
                limits = self.limits
                try:
                    body = await read_body(receive, limits.max_body_bytes, limits.read_timeout_s)
                except ClientGone:
                    exchange.abandon()  # it left half way through its body
                    return
                except ApiError as exc:
                    exchange.fail(exc)
                else:
                    exchange.feed(body)
            if not answered.done() and not await _answered_or_gone(answered, receive):
                exchange.abandon()
                return
            reply = answered.result()
            await send(send_fn, reply.status, reply.body, reply.headers, reply.content_type)
        finally:
            exchange.abandon()  # a no-op once answered; a cancelled handler withdraws
            exchange.release()

    def _closing_when_draining(self, send_fn: Send) -> Send:
        """``send_fn``, adding ``Connection: close`` to answers sent while draining.

        So clients stop reusing their connections before the listener closes at exit: a
        request sent on an idle keep-alive connection just as the server closes it would
        fail on the client's side although the server never saw it.
        """

        async def send_closing(message: Message) -> None:
            if self.draining and message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"connection", b"close")]}
            await send_fn(message)

        return send_closing

    async def _send_error(self, send_fn: Send, path: str, error: ApiError) -> None:
        if path.startswith("/v2"):
            body = json_bytes({"error": error.message})
        else:
            body = json_bytes(openai.error_body(error))
        await send(send_fn, error.status, body, error.headers())

    def _route(self, method: str, path: str) -> tuple[Handler, tuple[Any, ...]]:
        methods: dict[str, Handler] | None = None
        args: tuple[Any, ...] = ()
        static = self._static
        if path in static:
            methods = static[path]
        elif path.startswith("/v1/models/") and path.count("/") == 3:
            methods, args = {"GET": self._openai_model}, (path[len("/v1/models/") :],)
        elif path.startswith("/v2/models/"):
            parts = path[len("/v2/models/") :].split("/")
            name, rest = parts[0], parts[1:]
            if len(rest) >= 2 and rest[0] == "versions":
                if name in self.registry.models:  # else the handler's 404 names the models
                    triton.check_version(name, rest[1])
                rest = rest[2:]
            methods, args = self._model_routes.get(tuple(rest)), (name,)
        if methods is None:
            raise ApiError("not_found", f"no route {path!r}; see /docs")
        handler = methods.get(method)
        if handler is None:
            allowed = ", ".join(sorted(methods))
            raise ApiError(
                "method_not_allowed", f"{path} takes {allowed}, got {method}", allow=allowed
            )
        return handler, args

    def _static_routes(self) -> dict[str, dict[str, Handler]]:
        return {
            "/v1/embeddings": {"POST": self._not_routed},
            "/v1/models": {"GET": self._openai_models},
            "/v2": {"GET": self._kserve_server},
            "/v2/health/live": {"GET": self._live},
            "/v2/health/ready": {"GET": self._ready},
            "/v2/models/stats": {"GET": self._triton_all_stats},
            "/v2/repository/index": {"POST": self._triton_index},
            "/metrics": {"GET": self._metrics},
            "/status": {"GET": self._status},
            "/dashboard": {"GET": self._dashboard},
            "/openapi.json": {"GET": self._openapi},
            "/docs": {"GET": self._docs},
            "/": {"GET": self._index},
        }

    async def _not_routed(self, scope: Scope, receive: Receive, send_fn: Send, *args: Any) -> None:
        # Inference routes are exchanges (see inference_route); listed here for 405s only.
        raise AssertionError(f"{scope['method']} {scope['path']} is an inference exchange")

    # -- OpenAI ----------------------------------------------------------------------------

    async def _openai_models(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        authorize(read_head(scope["headers"]), self._key)
        await send(send_fn, 200, json_bytes(openai.models_response(list(self.registry.models))))

    async def _openai_model(self, scope: Scope, receive: Receive, send_fn: Send, name: str) -> None:
        authorize(read_head(scope["headers"]), self._key)
        self.registry.require(name)
        await send(send_fn, 200, json_bytes(openai.model_entry(name)))

    # -- KServe v2 -------------------------------------------------------------------------

    async def _kserve_server(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        await send(send_fn, 200, json_bytes(kserve.server_metadata()))

    async def _live(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        await send(send_fn, 200, b'{"live":true}')

    async def _ready(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        if self.draining:
            raise ApiError("draining", "the server is draining")
        if not self.registry.ready:
            loading = [m.name for m in self.registry.models.values() if not m.ready]
            raise ApiError("not_ready", f"models still loading: {', '.join(loading)}")
        await send(send_fn, 200, b'{"ready":true}')

    async def _kserve_model(self, scope: Scope, receive: Receive, send_fn: Send, name: str) -> None:
        model = self.registry.require(name, param="name")
        await send(send_fn, 200, json_bytes(kserve.model_metadata(name, model.loaded)))

    async def _kserve_model_ready(
        self, scope: Scope, receive: Receive, send_fn: Send, name: str
    ) -> None:
        model = self.registry.require(name, param="name")
        if self.draining:
            raise ApiError("draining", "the server is draining")
        if not model.ready:
            raise ApiError("not_ready", f"model {name!r} is {model.state}")
        await send(send_fn, 200, json_bytes({"name": name, "ready": True}))

    # -- Triton's extensions ---------------------------------------------------------------

    async def _triton_config(
        self, scope: Scope, receive: Receive, send_fn: Send, name: str
    ) -> None:
        model = self.registry.require(name, param="name")
        await send(send_fn, 200, json_bytes(triton.model_config(model)))

    async def _triton_stats(self, scope: Scope, receive: Receive, send_fn: Send, name: str) -> None:
        self.registry.require(name, param="name")
        entry = triton.model_statistics(name, self.metrics.account(name))
        await send(send_fn, 200, json_bytes({"model_stats": [entry]}))

    async def _triton_all_stats(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        entries = [
            triton.model_statistics(n, self.metrics.account(n)) for n in self.registry.models
        ]
        await send(send_fn, 200, json_bytes({"model_stats": entries}))

    async def _triton_index(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        head = read_head(scope["headers"])
        check_length(head, _SMALL_BODY)
        body = await read_body(receive, _SMALL_BODY, self.limits.read_timeout_s)
        ready_only = False
        if body.strip():
            data = load_json(body)
            if not isinstance(data, dict):
                raise ApiError("invalid", "body must be a JSON object", param="body")
            ready = data.get("ready", False)
            if not isinstance(ready, bool):
                raise ApiError("invalid", f"ready must be a boolean, got {ready!r}", param="ready")
            ready_only = ready
        models = list(self.registry.models.values())
        await send(send_fn, 200, json_bytes(triton.repository_index(models, ready_only=ready_only)))

    # -- operations and documentation ------------------------------------------------------

    async def _status(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        body = server_status(
            list(self.registry.models.values()),
            self.metrics,
            started_unix=self.started_unix,
            draining=self.draining,
        )
        await send(send_fn, 200, json_bytes(body))

    async def _dashboard(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        await send(send_fn, 200, dashboard_html(), DASHBOARD_HEADERS, content_type=_HTML)

    async def _metrics(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        await send(send_fn, 200, self.metrics.exposition(), content_type=CONTENT_TYPE.encode())

    def _openapi_spec(self) -> dict[str, Any]:
        dimensions = [
            m.loaded.dimension
            for m in self.registry.models.values()
            if m.loaded is not None and m.loaded.dimension is not None
        ]
        return openapi_spec(
            list(self.registry.models),
            secured=self._key is not None,
            limits=self.limits,
            dimensions=dimensions,
        )

    async def _openapi(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        spec = self._spec
        if spec is None:
            spec = json_bytes(self._openapi_spec())
            if self.registry.ready:  # the models' dimensions are known: it will not change
                self._spec = spec
        await send(send_fn, 200, spec)

    async def _docs(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        html = docs_html(self._openapi_spec())
        await send(send_fn, 200, html.encode(), content_type=_HTML)

    async def _index(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        body = {
            "name": "batchserve",
            "models": list(self.registry.models),
            "docs": "/docs",
            "openapi": "/openapi.json",
            "dashboard": "/dashboard",
            "status": "/status",
            "metrics": "/metrics",
        }
        await send(send_fn, 200, json_bytes(body))


async def _answered_or_gone(answered: asyncio.Future[Reply], receive: Receive) -> bool:
    """Wait for the answer or the client's disconnect, whichever first; True if answered."""
    watcher: asyncio.Future[Any] = asyncio.ensure_future(watch_disconnect(receive))
    waiting: set[asyncio.Future[Any]] = {answered, watcher}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    return answered.done()


def _stats_of(model: ServedModel) -> Callable[[], Any]:
    def stats() -> Any:
        return model.batcher.statistics() if model.batcher is not None else None

    return stats


def _class_stats_of(model: ServedModel) -> Callable[[], Any]:
    def stats() -> Any:
        b = model.batcher
        return None if b is None else (b.class_statistics(), b.class_depths())

    return stats


def _ready_of(model: ServedModel) -> Callable[[], bool]:
    return lambda: model.ready
