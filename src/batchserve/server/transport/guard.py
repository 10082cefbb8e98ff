"""A guard on every HTTP/1.1 connection, below the ASGI app: request heads slow or too big.

uvicorn reads a request's head (its request line and headers) before the application sees
anything, and on its fast path (``httptools``) it puts no bound on either: a client that
opens a connection and never sends, or sends its headers a byte at a time (slow loris),
holds a connection and its memory for ever, and one that sends a 20 MB header is buffered
whole. The application cannot answer what it never sees, so the guard is a subclass of
uvicorn's ``HttpToolsProtocol``, handed to uvicorn as its protocol class:

* **time**: a request's head must arrive within ``read_timeout_s`` of the connection's
  opening (first request) or of its first byte (later requests on a kept-alive connection);
  otherwise the client gets 408 ``request_timeout`` and the connection is closed. A
  connection that sends nothing at all is closed silently. (The body has its own deadline:
  see :mod:`batchserve.server.transport.httptools` and
  :func:`batchserve.server.transport.asgi.read_body`.) The timer is armed only when a read ends with
  a head still incomplete, so a request whose head
  arrives in one read, as almost all do, costs no timer.
* **size**: a head over ``max_head_bytes`` is refused with 431 ``head_too_large`` as soon as
  it passes the limit, and the connection is closed.
* **idle keep-alive connections** are closed ``timeout_keep_alive`` seconds after their last
  answer, as uvicorn does, but without uvicorn's two timer operations per request (a timer
  cancelled on every read and a new one armed after every answer): the connection's timer
  stays armed across requests, and when it fires it closes the connection only if no request
  has begun since the last answer and that answer is old enough; else it is armed again for
  what is left, or (a request under way) by that request's answer.

Both answers carry ``X-Reason`` and a JSON ``{"error": message}`` body, like the app's. They
are not inference requests: the request counters do not see them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

from typing_extensions import override
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from batchserve.clock import Clock, MonotonicClock
from batchserve.server.statuses import STATUS_TABLE

__all__ = ["MAX_HEAD_BYTES", "GuardedHttpToolsProtocol", "guarded_protocol"]

#: The default limit on a request's head (request line and headers), in bytes.
MAX_HEAD_BYTES = 64 * 1024

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _HeadTooLarge(Exception):
    """Raised inside a parser callback to stop parsing a head over the limit."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with a deadline and a size limit on request heads.

    Configured by subclassing (:func:`guarded_protocol`): uvicorn makes one instance per
    connection from the class it is given.
    """

    #: Seconds a request's head may take (408 past it).
    read_timeout_s: ClassVar[float] = 30.0
    #: The most bytes a request's head may have (431 past it).
    max_head_bytes: ClassVar[int] = MAX_HEAD_BYTES
    #: The server's clock: a request's arrival and the keep-alive's ages are read from it.
    clock: ClassVar[Clock] = MonotonicClock()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._in_head = False
        self._too_large = False
        self._arrival = 0.0  # when the current request's first byte came (on the clock)
        self._answered = 0.0  # when the last answer was written

    @override
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    @override
    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        super().connection_lost(exc)

    @override
    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        super().data_received(data)
        if self._in_head:
            self._arm()

    @override
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun()

    def _head_begun(self) -> None:
        # A request's first byte: its arrival, and its head's count and clock start.
        self._arrival = self.clock.now()
        self._head_bytes = 0
        self._in_head = True

    @override
    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    @override
    def on_header(self, name: bytes, value: bytes) -> None:
        # Runs for every header of every request: the count and uvicorn's own three
        # lines (lower-case name, ``Expect: 100-continue``, append) in one call.
        n = self._head_bytes + len(name) + len(value) + 4
        if n > self.max_head_bytes:
            self._too_large = True
            raise _HeadTooLarge
        self._head_bytes = n
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    @override
    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head = False
        super().on_headers_complete()

    # -- keep-alive: one timer per connection, not two timer operations per request --

    @override
    def _unset_keepalive_if_required(self) -> None:
        pass  # uvicorn calls this on every read; the timer stays armed (see above)

    @override
    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive timer armed only when none is.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._answered = self.clock.now()
        flow = self.flow
        if flow.read_paused:
            flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    @override
    def timeout_keep_alive_handler(self) -> None:
        self.timeout_keep_alive_task = None
        if self.transport.is_closing() or self._arrival >= self._answered:
            return  # closed, or a request began since the last answer: it re-arms
        left = self._answered + self.timeout_keep_alive - self.clock.now()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(
                left, self.timeout_keep_alive_handler
            )
        else:
            self.transport.close()

    @override
    def send_400_response(self, msg: str) -> None:
        # uvicorn answers a parser error with 400; a head stopped for its size gets 431.
        if self._too_large:
            self._refuse(
                431,
                "head_too_large",
                f"the request line and headers must be at most {self.max_head_bytes} bytes",
            )
            return
        super().send_400_response(msg)

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.max_head_bytes:
            self._too_large = True
            raise _HeadTooLarge

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.read_timeout_s, self._on_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _on_timeout(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._in_head:
            self._refuse(
                408,
                "request_timeout",
                f"the request's head must arrive within {self.read_timeout_s:g}s (--read-timeout)",
            )
        else:
            self.transport.close()  # opened and never used

    def _refuse(self, status: int, reason: str, message: str) -> None:
        assert STATUS_TABLE[reason][0] == status
        body = json.dumps({"error": message}).encode()
        head = (
            f"HTTP/1.1 {status} ".encode()
            + _REASONS[status]
            + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\nx-reason: "
            + reason.encode()
            + b"\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head + body)
        self.transport.close()


def guarded_protocol(
    *, read_timeout_s: float, max_head_bytes: int = MAX_HEAD_BYTES, clock: Clock | None = None
) -> type[GuardedHttpToolsProtocol]:
    """The guarded protocol class with these limits, for ``uvicorn.Config(http=...)``.

    A request's arrival and the keep-alive's ages are read from ``clock`` (the server's;
    default: monotonic time); the timers are the event loop's.
    """

    class Guarded(GuardedHttpToolsProtocol):
        pass

    Guarded.read_timeout_s = read_timeout_s
    Guarded.max_head_bytes = max_head_bytes
    Guarded.clock = clock if clock is not None else MonotonicClock()
    return Guarded
