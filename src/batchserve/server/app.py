"""The ASGI application: routing, API key, deadlines, disconnects, errors, drain.

Theory of operation
-------------------
:class:`App` is a bare ASGI callable (no framework: see :mod:`batchserve.server.asgi`). A
request is routed by method and path to a handler. An inference handler checks the API key,
finds the model (404) and its readiness (503 ``not_ready`` while it loads), reads the body
under the byte limit (413), parses and checks it (400/413/422, nothing queued), computes the
request's deadline, and hands its inputs to the model's batcher. While they wait, a watcher
reads ``http.disconnect``: a client that leaves cancels its inputs, which leave the queue
and never reach the model. The answer carries the timing headers; an error carries
``X-Reason`` (and for refusals ``Retry-After``), in the protocol's own error shape.

The deadline of a request is the tighter of ``X-Request-Timeout`` (seconds, ``0.25``, or
with a unit, ``250ms``) and KServe's ``parameters.timeout`` (microseconds) when it gives
them, else the model's default (``--timeout``), counted from the request's arrival. The
steps every inference call shares (API key, deadline, disconnect watch, timing headers) are
in :mod:`batchserve.server.calls`.

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
from typing import Any

from batchserve.errors import DeadlineExceeded
from batchserve.metrics import CONTENT_TYPE, Metrics
from batchserve.models.loader import LoadedModel, load_model
from batchserve.server import kserve, openai
from batchserve.server.asgi import (
    JSON_TYPE,
    ClientGone,
    Headers,
    Message,
    Receive,
    Scope,
    Send,
    check_body_type,
    get_header,
    json_bytes,
    read_body,
    send,
)
from batchserve.server.calls import authorize, compute, request_deadline, timing_headers
from batchserve.server.openapi import docs_html, openapi_spec
from batchserve.server.registry import Registry, ServedModel
from batchserve.server.settings import ServerSettings
from batchserve.server.statuses import ApiError, from_exception

__all__ = ["App", "create_app"]

log = logging.getLogger("batchserve.server")

Handler = Callable[..., Awaitable[None]]
_HTML = b"text/html; charset=utf-8"
_OCTETS = b"application/octet-stream"
#: The media types each protocol's bodies may be sent as (none given: read as JSON).
_OPENAI_TYPES = frozenset({"application/json"})
_KSERVE_TYPES = frozenset({"application/json", "application/octet-stream"})


def create_app(
    settings: ServerSettings, *, loader: Callable[[str], LoadedModel] = load_model
) -> App:
    """Build the ASGI application for ``settings`` (models load on startup)."""
    return App(settings, loader=loader)


class App:
    """The batchserve ASGI application. See the module docstring.

    Args:
        settings: models, limits, API key, drain timeout.
        loader: turns a model SPEC into a model (tests pass their own).

    Use as an ASGI app under uvicorn (the lifespan protocol loads the models), or directly:
    ``async with App(settings) as app: await app.wait_ready()``.
    """

    def __init__(
        self, settings: ServerSettings, *, loader: Callable[[str], LoadedModel] = load_model
    ) -> None:
        self.settings = settings
        self.limits = settings.limits
        self.metrics = Metrics()
        self.registry = Registry(
            [
                ServedModel(m, on_batch=self.metrics.observe_batch, loader=loader)
                for m in settings.models
            ]
        )
        for m in self.registry.models.values():
            self.metrics.add_model(m.name, _stats_of(m), _ready_of(m))
        self.draining = False
        self._key = settings.api_key.encode() if settings.api_key else None
        self._load_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Future[None] | None = None
        self._inflight = 0
        self._idle: asyncio.Event | None = None
        self._spec: bytes | None = None
        self._static = self._static_routes()
        self._model_routes: dict[tuple[str, ...], dict[str, Handler]] = {
            (): {"GET": self._kserve_model},
            ("ready",): {"GET": self._kserve_model_ready},
            ("infer",): {"POST": self._kserve_infer},
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
            handler, args = self._route(scope["method"], path)
            await handler(scope, receive, send_fn, *args)
        except Exception as exc:
            error = from_exception(exc)
            if error.reason == "internal":
                log.exception("internal error on %s %s", scope["method"], path)
            await self._send_error(send_fn, path, error)

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
            "/v1/embeddings": {"POST": self._openai_embeddings},
            "/v1/models": {"GET": self._openai_models},
            "/v2": {"GET": self._kserve_server},
            "/v2/health/live": {"GET": self._live},
            "/v2/health/ready": {"GET": self._ready},
            "/metrics": {"GET": self._metrics},
            "/openapi.json": {"GET": self._openapi},
            "/docs": {"GET": self._docs},
            "/": {"GET": self._index},
        }

    # -- shared steps ----------------------------------------------------------------------

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limits = self.limits
        return await read_body(scope, receive, limits.max_body_bytes, limits.read_timeout_s)

    def _model(self, name: str | None, param: str = "model") -> ServedModel:
        model = self.registry.get(name)
        if model is None:
            known = ", ".join(self.registry.models)
            raise ApiError(
                "not_found", f"model {name!r} is not served here; served: {known}", param=param
            )
        return model

    def _admit(self, model: ServedModel) -> LoadedModel:
        if self.draining:
            raise ApiError("draining", "the server is shutting down and admits no new requests")
        model.require_batcher()
        assert model.loaded is not None
        return model.loaded

    async def _inference(
        self,
        send_fn: Send,
        protocol: str,
        work: Callable[[_Call], Awaitable[tuple[bytes, Headers, bytes] | None]],
    ) -> None:
        """Run one inference request's ``work``, count it, and send its answer (200).

        ``work`` returns the body, headers and content type, or None if the client left.
        """
        call = _Call()
        self._inflight += 1
        self.metrics.observe_received()
        reason = "internal"
        outcome: str | None = None
        try:
            answer = await work(call)
            if answer is None:
                reason = "cancelled"
                return
            body, headers, ctype = answer
            await send(send_fn, 200, body, headers, ctype)
            reason = "ok"
        except ClientGone:
            reason = "cancelled"  # it left half way through its body: nobody to answer
        except Exception as exc:
            reason = from_exception(exc).reason
            if isinstance(exc, DeadlineExceeded) and exc.during_pass:
                outcome = "late"
            raise
        finally:
            elapsed = time.monotonic() - call.start
            self.metrics.observe_request(
                call.model,
                protocol,
                reason,
                elapsed if reason == "ok" else None,
                outcome=outcome,
            )
            self._inflight -= 1
            if self._inflight == 0 and self._idle is not None:
                self._idle.set()

    # -- OpenAI ----------------------------------------------------------------------------

    async def _openai_embeddings(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        async def work(call: _Call) -> tuple[bytes, Headers, bytes] | None:
            authorize(scope, self._key)
            check_body_type(scope, _OPENAI_TYPES)
            body = await self._read_body(scope, receive)
            req = openai.parse_embeddings_request(body, self.limits)
            model = self._model(req.model)
            call.model = model.name
            loaded = self._admit(model)
            if loaded.kind != "embedding":
                raise ApiError(
                    "invalid",
                    f"model {model.name!r} is not an embedding model; "
                    f"use POST /v2/models/{model.name}/infer",
                    param="model",
                )
            openai.check_dimensions(req.dimensions, loaded.dimension)
            deadline = request_deadline(scope, model, call.start, None)
            served = await compute(model, req.texts, deadline, receive)
            if served is None:
                return None
            if loaded.count_tokens is not None:
                tokens = sum(loaded.count_tokens(req.texts))
            else:
                tokens = sum(len(t.split()) for t in req.texts)
            out = openai.embeddings_response(
                model.name, [s.output for s in served], req.encoding_format, tokens
            )
            return json_bytes(out), timing_headers(served), JSON_TYPE

        await self._inference(send_fn, "openai", work)

    async def _openai_models(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        authorize(scope, self._key)
        await send(send_fn, 200, json_bytes(openai.models_response(list(self.registry.models))))

    async def _openai_model(self, scope: Scope, receive: Receive, send_fn: Send, name: str) -> None:
        authorize(scope, self._key)
        self._model(name)
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
        model = self._model(name, param="name")
        await send(send_fn, 200, json_bytes(kserve.model_metadata(name, model.loaded)))

    async def _kserve_model_ready(
        self, scope: Scope, receive: Receive, send_fn: Send, name: str
    ) -> None:
        model = self._model(name, param="name")
        if self.draining:
            raise ApiError("draining", "the server is draining")
        if not model.ready:
            raise ApiError("not_ready", f"model {name!r} is {model.state}")
        await send(send_fn, 200, json_bytes({"name": name, "ready": True}))

    async def _kserve_infer(self, scope: Scope, receive: Receive, send_fn: Send, name: str) -> None:
        async def work(call: _Call) -> tuple[bytes, Headers, bytes] | None:
            authorize(scope, self._key)
            model = self._model(name, param="name")
            call.model = model.name
            loaded = self._admit(model)
            check_body_type(scope, _KSERVE_TYPES)
            body = await self._read_body(scope, receive)
            req = kserve.parse_infer_request(
                body, get_header(scope, b"inference-header-content-length")
            )
            items: list[Any]
            if loaded.kind == "embedding":
                items = kserve.embedding_items(req, self.limits)
                extra = set(req.outputs) - {kserve.EMBEDDING_OUTPUT}
                if extra:
                    raise ApiError(
                        "invalid",
                        f"outputs asks for {sorted(extra)}; this model produces "
                        f"['{kserve.EMBEDDING_OUTPUT}']",
                        param="outputs",
                    )
            else:
                items = kserve.generic_items(req, self.limits)
            deadline = request_deadline(scope, model, call.start, req.timeout_s)
            served = await compute(model, items, deadline, receive)
            if served is None:
                return None
            outputs = kserve.stack_outputs(loaded.kind, [s.output for s in served])
            out, header_len = kserve.build_infer_response(model=name, request=req, outputs=outputs)
            headers = timing_headers(served)
            if header_len is None:
                return out, headers, JSON_TYPE
            headers.append((b"inference-header-content-length", str(header_len).encode()))
            return out, headers, _OCTETS

        await self._inference(send_fn, "kserve", work)

    # -- operations and documentation ------------------------------------------------------

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
        }
        await send(send_fn, 200, json_bytes(body))


class _Call:
    """What an inference request's handler learned, for its metrics."""

    __slots__ = ("model", "start")

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.model = ""


def _stats_of(model: ServedModel) -> Callable[[], Any]:
    def stats() -> Any:
        return model.batcher.statistics() if model.batcher is not None else None

    return stats


def _ready_of(model: ServedModel) -> Callable[[], bool]:
    return lambda: model.ready
