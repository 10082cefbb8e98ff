"""The routes that are not inference: metadata, health, Triton's extensions, operations, docs.

Theory of operation: the route table is data. :attr:`Routes.static` maps each fixed path
to its handlers by method; ``/v1/models/{name}`` and ``/v2/models/{name}[/versions/{v}]/...``
are resolved by shape, with the per-model table :attr:`Routes.model`. :meth:`Routes.resolve`
answers 404 for an unknown path and 405 (with ``Allow``) for a method a path does not take.
Inference routes are listed only for those 405s, from their one table
(:data:`batchserve.server.protocols.catalog.INFERENCE`): the application carries them as
exchanges (:meth:`batchserve.server.app.App.inference_route`). Each handler is a thin ASGI coroutine
over its protocol module (:mod:`~batchserve.server.protocols.openai`,
:mod:`~batchserve.server.protocols.kserve`, :mod:`~batchserve.server.protocols.triton`,
:mod:`~batchserve.server.protocols.tei`, :mod:`~batchserve.server.protocols.infinity`) or
view (:mod:`~batchserve.server.ops.live`,
:mod:`~batchserve.server.ops.dashboard`, :mod:`~batchserve.server.ops.openapi`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from batchserve.server.http import Head, check_length, json_bytes, load_json, read_head
from batchserve.server.ops.dashboard import DASHBOARD_HEADERS, dashboard_html
from batchserve.server.ops.docs_page import docs_html
from batchserve.server.ops.live import server_status
from batchserve.server.ops.metrics import CONTENT_TYPE, Metrics
from batchserve.server.ops.openapi import openapi_spec
from batchserve.server.protocols import infinity, kserve, openai, tei, triton
from batchserve.server.protocols.catalog import INFERENCE
from batchserve.server.protocols.dimensions import allowed_dimensions
from batchserve.server.registry import Registry
from batchserve.server.settings import RequestLimits
from batchserve.server.statuses import ApiError
from batchserve.server.transport.asgi import Handler, Receive, Scope, Send, read_body, send

__all__ = ["Handler", "Routes", "RoutesHost", "model_path"]


class RoutesHost(Protocol):
    """What the routes read of the application."""

    @property
    def registry(self) -> Registry:
        """The served models."""

    @property
    def metrics(self) -> Metrics:
        """The server's metrics."""

    @property
    def limits(self) -> RequestLimits:
        """The limits on a request."""

    @property
    def draining(self) -> bool:
        """Whether the server admits no new requests."""

    @property
    def started_unix(self) -> float:
        """When the server started (Unix seconds)."""

    def authorize(self, head: Head) -> str | None:
        """The tenant a request's key names; raises ``ApiError`` 401 without a key."""


_HTML = b"text/html; charset=utf-8"
#: The most a body to a route that is not inference may hold (the repository index's).
_SMALL_BODY = 64 * 1024


def model_path(path: str) -> tuple[str, str | None, tuple[str, ...]] | None:
    """``/v2/models/{name}[/versions/{v}]/PART/...`` as ``(name, v or None, (PART, ...))``.

    None for a path outside ``/v2/models/``. The one reading of the grammar: the routes
    here and :meth:`App.inference_route <batchserve.server.app.App.inference_route>` share it.
    """
    if not path.startswith("/v2/models/"):
        return None
    name, *rest = path[len("/v2/models/") :].split("/")
    if len(rest) >= 2 and rest[0] == "versions":
        return name, rest[1], tuple(rest[2:])
    return name, None, tuple(rest)


class Routes:
    """The application's routes other than inference, and their handlers.

    Args:
        app: the application whose models, metrics and drain the handlers report; its
            ``authorize`` guards the OpenAI model listings, as it guards inference.
        secured: whether that takes a key (the OpenAPI document says so).
    """

    def __init__(self, app: RoutesHost, *, secured: bool) -> None:
        self.app = app
        self._secured = secured
        self._spec: bytes | None = None
        self._tokenizers: dict[str, tei.Tokenizing] = {}
        #: Fixed paths, each to its handlers by method.
        self.static = self._static_routes()
        #: ``/v2/models/{name}[/versions/{v}]`` + these parts, each to its handlers.
        self.model: dict[tuple[str, ...], dict[str, Handler]] = {
            (): {"GET": self._kserve_model},
            ("ready",): {"GET": self._kserve_model_ready},
            ("config",): {"GET": self._triton_config},
            ("stats",): {"GET": self._triton_stats},
        }
        # The inference routes are exchanges (App.inference_route): listed here, from the
        # one route table, for the 405s of the methods they do not take.
        for route in INFERENCE:
            model = model_path(route.path)
            routes = (
                self.model.setdefault(model[2], {})
                if model
                else self.static.setdefault(route.path, {})
            )
            routes[route.method] = self._not_routed

    def resolve(self, method: str, path: str) -> tuple[Handler, tuple[Any, ...]]:
        """The handler of ``method path`` and the arguments it takes from the path.

        Raises:
            ApiError: 404 ``not_found`` for an unknown path, 405 for a method it does not
                take (naming those it does), 404 for a model version that is not served.
        """
        methods: dict[str, Handler] | None = None
        args: tuple[Any, ...] = ()
        static = self.static
        if path in static:
            methods = static[path]
        elif path.startswith("/v1/models/") and path.count("/") == 3:
            methods, args = {"GET": self._openai_model}, (path[len("/v1/models/") :],)
        elif (model := model_path(path)) is not None:
            name, version, rest = model
            if version is not None and name in self.app.registry.models:
                triton.check_version(name, version)  # else the handler's 404 names the models
            methods, args = self.model.get(rest), (name,)
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
            "/info": {"GET": self._tei_info},
            "/tokenize": {"POST": self._tei_tokenize},
            "/decode": {"POST": self._tei_decode},
            "/health": {"GET": self._health},
            "/models": {"GET": self._infinity_models},
        }

    async def _not_routed(self, scope: Scope, receive: Receive, send_fn: Send, *args: Any) -> None:
        # Inference routes are exchanges (see App.inference_route); listed for 405s only.
        raise AssertionError(f"{scope['method']} {scope['path']} is an inference exchange")

    # -- OpenAI ----------------------------------------------------------------------------

    async def _openai_models(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        self.app.authorize(read_head(scope["headers"]))
        await send(send_fn, 200, json_bytes(openai.models_response(list(self.app.registry.models))))

    async def _openai_model(self, scope: Scope, receive: Receive, send_fn: Send, name: str) -> None:
        self.app.authorize(read_head(scope["headers"]))
        self.app.registry.require(name)
        await send(send_fn, 200, json_bytes(openai.model_entry(name)))

    # -- text-embeddings-inference ---------------------------------------------------------

    async def _tei_info(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        model = self.app.registry.default
        await send(send_fn, 200, json_bytes(tei.info(model, self.app.limits)))

    async def _tei_tokenizing(self, scope: Scope, receive: Receive) -> tuple[Any, Any]:
        head = read_head(scope["headers"])
        self.app.authorize(head)
        limits = self.app.limits
        check_length(head, limits.max_body_bytes)
        body = await read_body(receive, limits.max_body_bytes, limits.read_timeout_s)
        model = self.app.registry.default
        model.require_batcher()
        tokenizing = self._tokenizers.get(model.name)
        if tokenizing is None:
            assert model.loaded is not None
            tokenizing = tei.Tokenizing.of(model.loaded)
            if tokenizing is None:
                raise ApiError(
                    "wrong_kind",
                    f"model {model.name!r} has no tokenizer to answer /tokenize or /decode",
                )
            self._tokenizers[model.name] = tokenizing
        return tokenizing, load_json(body)

    async def _tei_tokenize(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        tokenizing, data = await self._tei_tokenizing(scope, receive)
        tokens = await asyncio.to_thread(tokenizing.tokenize, data, self.app.limits)
        await send(send_fn, 200, json_bytes(tokens))

    async def _tei_decode(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        tokenizing, data = await self._tei_tokenizing(scope, receive)
        await send(
            send_fn,
            200,
            json_bytes(await asyncio.to_thread(tokenizing.decode, data, self.app.limits)),
        )

    async def _health(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        # TEI's and Infinity's: 200 when the models serve, with Infinity's {"unix": seconds}
        # (TEI's clients read only the status), else 503 with TEI's error.
        if self.app.draining or not self.app.registry.ready:
            state = "draining" if self.app.draining else "loading"
            body = {"error": f"unhealthy: the server is {state}", "error_type": "unhealthy"}
            await send(send_fn, 503, json_bytes(body))
            return
        await send(send_fn, 200, json_bytes(infinity.health_body()))

    # -- Infinity --------------------------------------------------------------------------

    async def _infinity_models(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        self.app.authorize(read_head(scope["headers"]))
        models = list(self.app.registry.models.values())
        await send(send_fn, 200, json_bytes(infinity.models_response(models)))

    # -- KServe v2 -------------------------------------------------------------------------

    async def _kserve_server(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        await send(send_fn, 200, json_bytes(kserve.server_metadata()))

    async def _live(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        await send(send_fn, 200, b'{"live":true}')

    async def _ready(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        if self.app.draining:
            raise ApiError("draining", "the server is draining")
        if not self.app.registry.ready:
            loading = [m.name for m in self.app.registry.models.values() if not m.ready]
            raise ApiError("not_ready", f"models still loading: {', '.join(loading)}")
        await send(send_fn, 200, b'{"ready":true}')

    async def _kserve_model(self, scope: Scope, receive: Receive, send_fn: Send, name: str) -> None:
        model = self.app.registry.require(name, param="name")
        await send(send_fn, 200, json_bytes(kserve.model_metadata(name, model.loaded)))

    async def _kserve_model_ready(
        self, scope: Scope, receive: Receive, send_fn: Send, name: str
    ) -> None:
        model = self.app.registry.require(name, param="name")
        if self.app.draining:
            raise ApiError("draining", "the server is draining")
        if not model.ready:
            raise ApiError("not_ready", f"model {name!r} is {model.state}")
        await send(send_fn, 200, json_bytes({"name": name, "ready": True}))

    # -- Triton's extensions ---------------------------------------------------------------

    async def _triton_config(
        self, scope: Scope, receive: Receive, send_fn: Send, name: str
    ) -> None:
        model = self.app.registry.require(name, param="name")
        await send(send_fn, 200, json_bytes(triton.model_config(model)))

    async def _triton_stats(self, scope: Scope, receive: Receive, send_fn: Send, name: str) -> None:
        self.app.registry.require(name, param="name")
        entry = triton.model_statistics(name, self.app.metrics.account(name))
        await send(send_fn, 200, json_bytes({"model_stats": [entry]}))

    async def _triton_all_stats(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        entries = [
            triton.model_statistics(n, self.app.metrics.account(n))
            for n in self.app.registry.models
        ]
        await send(send_fn, 200, json_bytes({"model_stats": entries}))

    async def _triton_index(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        head = read_head(scope["headers"])
        check_length(head, _SMALL_BODY)
        body = await read_body(receive, _SMALL_BODY, self.app.limits.read_timeout_s)
        ready_only = False
        if body.strip():
            data = load_json(body)
            if not isinstance(data, dict):
                raise ApiError("invalid", "body must be a JSON object", param="body")
            ready = data.get("ready", False)
            if not isinstance(ready, bool):
                raise ApiError("invalid", f"ready must be a boolean, got {ready!r}", param="ready")
            ready_only = ready
        models = list(self.app.registry.models.values())
        await send(send_fn, 200, json_bytes(triton.repository_index(models, ready_only=ready_only)))

    # -- operations and documentation ------------------------------------------------------

    async def _status(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        body = server_status(
            list(self.app.registry.models.values()),
            self.app.metrics,
            started_unix=self.app.started_unix,
            draining=self.app.draining,
        )
        await send(send_fn, 200, json_bytes(body))

    async def _dashboard(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        await send(send_fn, 200, dashboard_html(), DASHBOARD_HEADERS, content_type=_HTML)

    async def _metrics(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        await send(send_fn, 200, self.app.metrics.exposition(), content_type=CONTENT_TYPE.encode())

    def _openapi_spec(self) -> dict[str, Any]:
        loaded = [m.loaded for m in self.app.registry.models.values() if m.loaded is not None]
        # What a dimensions field takes: each model's own and those it declares.
        accepted = [(m, allowed_dimensions(m)) for m in loaded if m.dimension is not None]
        dimensions = [d for m, dims in accepted for d in (dims or (m.dimension,)) if d]
        any_prefix = any(dims is None for _, dims in accepted)
        prompts = [
            name
            for m in self.app.registry.models.values()
            if m.loaded is not None and m.loaded.prompts is not None
            for name in m.loaded.prompts.prompts
        ]
        return openapi_spec(
            list(self.app.registry.models),
            secured=self._secured,
            limits=self.app.limits,
            dimensions=dimensions,
            prompts=prompts,
            calibrated=any(
                m.loaded is not None and m.loaded.calibration is not None
                for m in self.app.registry.models.values()
            ),
            any_prefix=any_prefix,
        )

    async def _openapi(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        spec = self._spec
        if spec is None:
            spec = json_bytes(self._openapi_spec())
            if self.app.registry.ready:  # the models' dimensions are known: it will not change
                self._spec = spec
        await send(send_fn, 200, spec)

    async def _docs(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        html = docs_html(self._openapi_spec())
        await send(send_fn, 200, html.encode(), content_type=_HTML)

    async def _index(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        body = {
            "name": "batchserve",
            "models": list(self.app.registry.models),
            "docs": "/docs",
            "openapi": "/openapi.json",
            "dashboard": "/dashboard",
            "status": "/status",
            "metrics": "/metrics",
        }
        await send(send_fn, 200, json_bytes(body))
