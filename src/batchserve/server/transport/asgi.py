"""The ASGI transport: any ASGI server, or an in-process client, carries requests to the app.

:class:`AsgiDriver` is the app's ASGI entry point (``App.__call__``). It carries an
inference request as an :class:`~batchserve.server.exchange.Exchange`, as the connection
protocol (:mod:`batchserve.server.transport.httptools`) does, with a task per request (the
ASGI server's) and a watch for the client's disconnect; it hands every other request to the
route table (:mod:`batchserve.server.routes`), and runs the lifespan protocol.

The I/O primitives are the ones the route handlers use too:

* :func:`read_body` reads the request body under a byte limit and a time limit (408: a
  client that sends its body slowly, or stops half way, holds nothing for long); a client
  that disconnects half way raises :class:`ClientGone`.
* :func:`send` answers a status, headers and a body in one go.
* :func:`watch_disconnect` waits for the client to leave after its body was read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol, TypeAlias

from batchserve.server.exchange import ARRIVAL, Endpoint, Gate, Reply
from batchserve.server.http import JSON_TYPE, Headers, json_bytes, read_head
from batchserve.server.protocols import openai, tei
from batchserve.server.statuses import ApiError, from_exception

__all__ = [
    "AsgiDriver",
    "AsgiHost",
    "ClientGone",
    "Handler",
    "Message",
    "Receive",
    "Router",
    "Scope",
    "Send",
    "read_body",
    "send",
    "watch_disconnect",
]

log = logging.getLogger("batchserve.server")

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
#: A route's handler: ``handler(scope, receive, send, *args from the path)``.
Handler: TypeAlias = Callable[..., Awaitable[None]]


class Router(Protocol):
    """The routes that are not inference (:class:`batchserve.server.routes.Routes`)."""

    def resolve(self, method: str, path: str) -> tuple[Handler, tuple[Any, ...]]:
        """The handler of ``method path`` and its arguments; raises ``ApiError`` 404/405."""


class AsgiHost(Gate, Protocol):
    """What the ASGI driver needs of the application besides its exchanges."""

    @property
    def routes(self) -> Router:
        """The route table of every request that is not an exchange."""

    async def start(self) -> None:
        """Start loading the models (lifespan startup)."""

    async def stop(self) -> None:
        """Drain and stop (lifespan shutdown)."""


class AsgiDriver:
    """The application's ASGI entry point (``http`` and ``lifespan``), over ``host``."""

    __slots__ = ("host",)

    def __init__(self, host: AsgiHost) -> None:
        self.host = host

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
                await self.host.start()
                await send_fn({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.host.stop()
                await send_fn({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send_fn: Send) -> None:
        path: str = scope["path"]
        host = self.host
        send_fn = self._closing_when_draining(send_fn)
        try:
            route = host.inference_route(scope["method"], path)
            if route is not None:
                await self._exchange(scope, receive, send_fn, *route)
                return
            handler, args = host.routes.resolve(scope["method"], path)
            await handler(scope, receive, send_fn, *args)
        except Exception as exc:
            error = from_exception(exc)
            if error.reason == "internal":
                log.exception("internal error on %s %s", scope["method"], path)
            await _send_error(send_fn, path, error)

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
        exchange = self.host.begin(
            endpoint,
            model_name,
            head,
            arrival if arrival is not None else self.host.clock.now(),
            answered.set_result,
        )
        try:
            if not exchange.done:
                limits = self.host.limits
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
            await send(send_fn, reply.status, reply.body, reply.all_headers(), reply.content_type)
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
            if self.host.draining and message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"connection", b"close")]}
            await send_fn(message)

        return send_closing


#: The routes of text-embeddings-inference's API that are not exchanges: TEI's error shape.
_TEI_PATHS = frozenset({"/info", "/health", "/tokenize", "/decode"})


async def _send_error(send_fn: Send, path: str, error: ApiError) -> None:
    if path.startswith("/v2"):
        body = json_bytes({"error": error.message})
    elif path in _TEI_PATHS:
        body = tei.error_body(error)
    else:
        body = json_bytes(openai.error_body(error))
    await send(send_fn, error.status, body, error.headers())


async def _answered_or_gone(answered: asyncio.Future[Reply], receive: Receive) -> bool:
    """Wait for the answer or the client's disconnect, whichever first; True if answered."""
    watcher: asyncio.Future[Any] = asyncio.ensure_future(watch_disconnect(receive))
    waiting: set[asyncio.Future[Any]] = {answered, watcher}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    return answered.done()


class ClientGone(Exception):
    """The client disconnected before its request's body had arrived whole."""


async def read_body(
    receive: Receive, limit: int, timeout_s: float | None = None, declared: int | None = None
) -> bytes:
    """The whole request body, at most ``limit`` bytes, within ``timeout_s`` seconds.

    Args:
        receive: the ASGI receive callable.
        limit: the most bytes the body may have.
        timeout_s: seconds from the call in which the whole body must arrive (None: no limit).
        declared: the ``Content-Length`` (from :func:`check_length`), for the messages.

    Raises:
        ApiError: ``too_large`` (413) once the body exceeds ``limit``; ``request_timeout``
            (408, the connection is then closed) if the whole body has not arrived
            ``timeout_s`` seconds after the call.
        ClientGone: the client disconnected before the body was whole.
    """
    chunks: list[bytes] = []
    total = 0
    # One deadline for the whole body, not for each read: a client that trickles a byte at
    # a time (slow loris) must not hold the request open for ever.
    until = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            async with asyncio.timeout_at(until):
                message = await receive()
        except TimeoutError:
            raise ApiError(
                "request_timeout",
                f"the body must arrive within {timeout_s:g}s (--read-timeout); "
                f"{total} bytes came"
                + (f" of the {declared} declared" if declared is not None else ""),
                param="body",
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientGone("the client disconnected while sending its body")
        chunk = message.get("body", b"")
        if chunk:
            total += len(chunk)
            if total > limit:
                raise ApiError(
                    "too_large",
                    f"body must be at most {limit} bytes (--max-body-bytes), got more",
                    param="body",
                )
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send(
    send_fn: Send,
    status: int,
    body: bytes,
    headers: Headers | None = None,
    content_type: bytes = JSON_TYPE,
) -> None:
    """Send one complete response."""
    all_headers: Headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
    ]
    if headers:
        all_headers.extend(headers)
    await send_fn({"type": "http.response.start", "status": status, "headers": all_headers})
    await send_fn({"type": "http.response.body", "body": body})


async def watch_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (call after the body was read whole)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
