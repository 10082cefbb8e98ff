"""A tiny HTTP/1.1 server whose answers (status, headers, delay) are chosen by a test.

It runs its own event loop in a thread, listens on 127.0.0.1 and a free port, and records
every request: its arrival order, arrival time (``time.monotonic()``, the generator's clock),
path, headers and body, and when it answered. The handler decides each answer; delays are
event-loop timers, so a slow answer never blocks the others.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

import httptools


@dataclass
class Seen:
    """One request as the server saw it."""

    seq: int
    arrived: float
    path: str
    headers: dict[str, str]
    body: bytes
    conn_served: int = 0  # requests this connection had answered before this one
    answered: float = float("nan")


@dataclass
class Reply:
    """How to answer: ``at`` (absolute monotonic time) wins over ``delay_s``."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b'{"object":"list","data":[]}'
    delay_s: float = 0.0
    at: float | None = None
    never: bool = False
    close: bool = False
    drop: bool = False  # close the connection at once, without an answer


Handler = Callable[[Seen], Reply]

_PHRASES = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error"}


class _Conn(asyncio.Protocol):
    def __init__(self, server: TinyServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.headers: dict[str, str] = {}
        self.body = b""
        self.url = b""
        self.served = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections += 1
        self.server.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.open.discard(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.headers = {}
        self.body = b""
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        seen = Seen(
            seq=len(self.server.seen),
            arrived=time.monotonic(),
            path=self.url.decode(),
            headers=self.headers,
            body=self.body,
            conn_served=self.served,
        )
        self.server.seen.append(seen)
        reply = self.server.handler(seen)
        if reply.drop and self.transport is not None:
            self.transport.close()
            return
        if reply.never:
            return
        self.served += 1
        loop = asyncio.get_running_loop()
        at = reply.at if reply.at is not None else seen.arrived + reply.delay_s
        loop.call_later(max(0.0, at - time.monotonic()), self.answer, seen, reply)

    def answer(self, seen: Seen, reply: Reply) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        seen.answered = time.monotonic()
        head = [f"HTTP/1.1 {reply.status} {_PHRASES.get(reply.status, 'Status')}"]
        head += [f"{k}: {v}" for k, v in reply.headers.items()]
        head.append(f"Content-Length: {len(reply.body)}")
        head.append("Content-Type: application/json")
        if reply.close:
            head.append("Connection: close")
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + reply.body)
        if reply.close:
            self.transport.close()


class TinyServer:
    """``with TinyServer(handler) as srv:`` serves on ``srv.url`` until the block ends."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[Seen] = []
        self.connections = 0
        self.open: set[_Conn] = set()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await self._loop.create_server(
                lambda: _Conn(self), "127.0.0.1", 0, backlog=1024
            )
            self.port = self._server.sockets[0].getsockname()[1]

        self._loop.run_until_complete(start())
        # Ready only once run_forever runs, so that a stop cannot land in run_until_complete.
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()
        assert self._server is not None
        self._server.close()
        for conn in list(self.open):
            if conn.transport is not None:
                conn.transport.abort()
        self._loop.run_until_complete(self._server.wait_closed())
        self._loop.run_until_complete(asyncio.sleep(0.01))  # let connection_lost run
        self._loop.close()

    def __enter__(self) -> TinyServer:
        self._thread.start()
        assert self._ready.wait(10), "the test server did not start"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the test server did not stop"
