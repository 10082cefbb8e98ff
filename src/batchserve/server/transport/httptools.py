"""The connection protocol: inference requests carried straight from the parser to the batcher.

Theory of operation
-------------------
uvicorn hands every request to the ASGI app in a task of its own, with an event per body
chunk and a send coroutine per message; measured under load, that machinery cost more than
everything batchserve does with a request. So for the requests that carry the load,
inference ``POST``s (:meth:`App.inference_route <batchserve.server.app.App.inference_route>`),
this protocol (a subclass of uvicorn's httptools protocol, with the head guard of
:mod:`batchserve.server.transport.guard`) runs the request's
:class:`~batchserve.server.exchange.Exchange` itself, from the parser's callbacks, with no task,
future or timer per request:

* ``on_message_begin`` notes the arrival (the request's deadline counts from its first byte);
* ``on_headers_complete`` opens the exchange (:meth:`App.begin`): a refusal is written at
  once, before the body is read, and the rest of the body is then passed over;
* ``on_body`` gathers the body under the byte limit (413 past it);
* ``on_message_complete`` feeds the body to the exchange, which offers its inputs to the
  batcher with itself as their waiter;
* the batcher settles the inputs and the exchange calls :meth:`_respond`, which writes the
  status line, headers and body in one ``write`` and lets the next request in.

A client that disconnects abandons its exchange (its queued inputs leave the queue and never
reach the model). A body that has not arrived whole ``read_timeout_s`` after its head is
answered 408 and the connection closed (a timer is armed only when a read ends with a body
still incomplete). While the server drains, answers carry ``Connection: close``.

Every other request (other routes and methods, ``Expect: 100-continue``, a percent-encoded
path, a request pipelined behind an unanswered one) goes to the ASGI app as uvicorn does it,
in order: a request pipelined behind a pending exchange waits in uvicorn's own pipeline until
that exchange is answered.
"""

from __future__ import annotations

from typing import Any, ClassVar

from typing_extensions import override
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_local_addr, get_remote_addr, is_ssl

from batchserve.server.exchange import ARRIVAL, Exchange, Gate, Reply
from batchserve.server.http import read_head
from batchserve.server.statuses import ApiError
from batchserve.server.transport.guard import MAX_HEAD_BYTES, GuardedHttpToolsProtocol

__all__ = ["ExchangeProtocol", "connection_protocol"]


class ExchangeProtocol(GuardedHttpToolsProtocol):
    """uvicorn's httptools protocol that runs inference exchanges without ASGI.

    Configured by subclassing (:func:`connection_protocol`), with the application it serves.
    """

    #: The application, as the transports see it.
    gate: ClassVar[Gate]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._exchange: Exchange | None = None  # the current one, until answered
        self._reading = False  # the current message is an exchange's, not yet whole
        self._body: list[bytes] = []
        self._body_size = 0
        self._body_timer: Any = None
        self._keep_alive = True

    @override
    def connection_made(self, transport: Any) -> None:
        # uvicorn's, less its two address look-ups (each builds a socket object, which
        # under a burst of new connections costs the loop more than a request): only a
        # request that goes to the ASGI app needs the addresses, and it looks them up.
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        self.server: tuple[str, int | None] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "https" if is_ssl(transport) else "http"
        self._arm()  # the guard's: a connection that never sends is closed

    # -- parser callbacks --------------------------------------------------------------

    @override
    def on_message_begin(self) -> None:
        # uvicorn's and the guard's, less the ASGI scope (a dict of ten entries), which
        # only a request that goes to the ASGI app needs: it is made for that one when
        # its head is whole (``_make_scope``).
        self.url = b""
        self.expect_100_continue = False
        headers: list[tuple[bytes, bytes]] = []
        self.headers = headers
        self._head_begun()

    @override
    def on_headers_complete(self) -> None:
        route = None
        parser = self.parser
        cycle = self.cycle
        if (
            parser.get_method() == b"POST"
            and self._exchange is None
            and (cycle is None or cycle.response_complete)
            and not self.expect_100_continue
            and not parser.should_upgrade()
        ):
            path = self.url.partition(b"?")[0]
            if b"%" not in path:
                route = self.gate.inference_route("POST", path.decode("latin-1"))
        if route is None:
            if self.client is None:
                self.server = get_local_addr(self.transport)
                self.client = get_remote_addr(self.transport)
            scope = self._make_scope()
            super().on_headers_complete()
            scope["extensions"] = {ARRIVAL: self._arrival}
            return
        self._disarm()  # the head is whole: the guard's timer, if armed
        self._in_head = False
        self._keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        self._reading = True
        self._body = []
        self._body_size = 0
        exchange = self.gate.begin(
            route[0], route[1], read_head(self.headers), self._arrival, self._respond
        )
        if exchange.done:
            exchange.release()  # refused from its head: the answer is written already
        else:
            self._exchange = exchange

    def _make_scope(self) -> Any:
        # uvicorn's scope, made by its own on_message_begin, on the head already read.
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        HttpToolsProtocol.on_message_begin(self)
        self.url, self.headers, self.expect_100_continue = url, headers, expect
        scope: Any = self.scope  # an HTTPScope, with batchserve's own extension below
        scope["headers"] = headers
        return scope

    @override
    def on_body(self, body: bytes) -> None:
        if not self._reading:
            super().on_body(body)
            return
        exchange = self._exchange
        if exchange is None or exchange.done:
            return  # answered already (refused from its head): the body is passed over
        self._body_size += len(body)
        limit = self.gate.limits.max_body_bytes
        if self._body_size > limit:
            exchange.fail(
                ApiError(
                    "too_large",
                    f"body must be at most {limit} bytes (--max-body-bytes), got more",
                    param="body",
                )
            )
            return
        self._body.append(body)

    @override
    def on_message_complete(self) -> None:
        if not self._reading:
            super().on_message_complete()
            return
        self._reading = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        exchange = self._exchange
        if exchange is not None and not exchange.done:
            chunks = self._body
            self._body = []
            exchange.feed(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    @override
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._reading and self._body_timer is None and not self.transport.is_closing():
            self._body_timer = self.loop.call_later(self.read_timeout_s, self._body_late)

    # -- answers -----------------------------------------------------------------------

    def _respond(self, reply: Reply) -> None:
        # The current exchange's answer (None while it is being opened: a refusal from
        # its head, released by on_headers_complete).
        exchange = self._exchange
        self._exchange = None
        transport = self.transport
        if not transport.is_closing():
            close = not self._keep_alive or self.gate.draining
            parts = [STATUS_LINE[reply.status]]
            for name, value in self.server_state.default_headers:
                parts += (name, b": ", value, b"\r\n")
            body = reply.body
            parts += (
                b"content-type: ",
                reply.content_type,
                b"\r\ncontent-length: %d\r\n" % len(body),
            )
            for name, value in reply.headers:
                if name == b"connection":
                    close = True
                    continue
                parts += (name, b": ", value, b"\r\n")
            parts.append(reply.head)
            if close:
                parts.append(b"connection: close\r\n")
            parts += (b"\r\n", body)
            transport.write(b"".join(parts))
            if close:
                transport.close()
        if exchange is not None:
            exchange.release()
        self.on_response_complete()

    def _body_late(self) -> None:
        self._body_timer = None
        if not self._reading:
            return
        exchange = self._exchange
        if exchange is None or exchange.done:
            # Answered from its head, and the rest of its body still has not come: the
            # connection cannot carry another request until it has, so it is closed.
            self.transport.close()
            return
        self._reading = False
        exchange.fail(
            ApiError(
                "request_timeout",
                f"the body must arrive within {self.read_timeout_s:g}s (--read-timeout); "
                f"{self._body_size} bytes came",
                param="body",
            )
        )

    # -- connection life ---------------------------------------------------------------

    @override
    def _start_asgi_task(self, cycle: Any, asgi_app: Any) -> None:
        if self._exchange is not None:
            # Pipelined behind an unanswered exchange: it waits its turn, as uvicorn
            # makes a request pipelined behind an unfinished one wait.
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, asgi_app))
            return
        super()._start_asgi_task(cycle, asgi_app)

    @override
    def connection_lost(self, exc: Exception | None) -> None:
        exchange = self._exchange
        if exchange is not None:
            self._exchange = None
            exchange.abandon()
            exchange.release()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().connection_lost(exc)

    @override
    def shutdown(self) -> None:
        if self._exchange is not None:
            self._keep_alive = False  # closed once its answer is written
            return
        super().shutdown()


def connection_protocol(
    app: Gate, *, read_timeout_s: float, max_head_bytes: int = MAX_HEAD_BYTES
) -> type[ExchangeProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, serving ``app``'s exchanges."""

    class Serving(ExchangeProtocol):
        pass

    Serving.gate = app
    Serving.read_timeout_s = read_timeout_s
    Serving.max_head_bytes = max_head_bytes
    Serving.clock = app.clock
    return Serving
