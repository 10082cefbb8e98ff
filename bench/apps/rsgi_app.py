"""batchserve's application under Granian's RSGI interface (HTTP parsed in Rust), measured only.

The issue asked whether a Rust HTTP layer should be offered (``--http granian``). This module
is what that would run: an :class:`~batchserve.server.exchange.Exchange` per inference
request, opened from its head (refusals before the body), fed its body, answered through its
``respond`` callback, as the connection protocol
(:mod:`batchserve.server.transport.httptools`) does; every other route through the ASGI application
with a minimal scope. ``bench/server/request_path.py``
runs it as ``batchserve-rsgi``, embedded in one event loop with the null model (Granian,
one Rust runtime thread).

Measured on this machine (2 cores), side by side with ``wrk -t1 -c64``: 0.74x the yardstick
vs 0.58x for the uvicorn connection protocol (quiet; 5.8-8.0k vs 5.2-5.5k req/s busy). Open
loop (``bench/server/open_loop_gap.py --server rsgi``) it is worse: client p99 8.3, 7.8 and 29 ms at
1,900, 2,850 and 4,270 requests/s against 3.9, 4.0 and 10.5 ms, at more server CPU. So it
is not offered; it also would not see a client that disconnects while its request waits
(RSGI reports a disconnect only to a task awaiting it: a task per request).

Run alone: ``python bench/apps/rsgi_app.py --port 8002``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from batchserve.server.app import App
from batchserve.server.exchange import Reply
from batchserve.server.http import HEAD_FIELDS, Head
from batchserve.server.transport.asgi import Message

#: The header names the server reads, as Granian's header map takes them (``str``).
_FIELDS = tuple((name, name.decode("latin-1")) for name in HEAD_FIELDS)


class RsgiApp:
    """The RSGI application around an :class:`App` (Granian calls ``__rsgi__``)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        """One request: inference routes as exchanges, the rest through the ASGI app."""
        if scope.proto != "http":
            return
        arrival = time.monotonic()
        route = self.app.inference_route(scope.method, scope.path)
        if route is None:
            await self._asgi(scope, proto)
            return
        headers = scope.headers
        head: Head = {}
        for name, key in _FIELDS:
            value = headers.get(key)
            if value is not None:
                head[name] = value.encode("latin-1")
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Reply] = loop.create_future()
        exchange = self.app.begin(route[0], route[1], head, arrival, answered.set_result)
        try:
            if not exchange.done:
                body = await proto()
                exchange.feed(body)
            reply = answered.result() if answered.done() else await answered
            out = [("content-type", reply.content_type.decode("latin-1"))]
            out += [(n.decode("latin-1"), v.decode("latin-1")) for n, v in reply.headers]
            if self.app.draining:
                out.append(("connection", "close"))
            proto.response_bytes(reply.status, out, reply.body)
        finally:
            exchange.abandon()  # a no-op once answered; a cancelled handler withdraws
            exchange.release()

    async def _asgi(self, scope: Any, proto: Any) -> None:
        body = await proto() if scope.method in ("POST", "PUT", "PATCH") else b""
        asgi_scope = {
            "type": "http",
            "http_version": scope.http_version,
            "method": scope.method,
            "scheme": scope.scheme,
            "path": scope.path,
            "raw_path": scope.path.encode("latin-1"),
            "query_string": scope.query_string.encode("latin-1"),
            "root_path": "",
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()
            ],
            "client": None,
            "server": None,
        }
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        status = 500
        out: list[tuple[str, str]] = []
        chunks: list[bytes] = []

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                out.extend(
                    (k.decode("latin-1"), v.decode("latin-1"))
                    for k, v in message.get("headers", [])
                    if k.lower() != b"content-length"
                )
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(asgi_scope, receive, send)
        proto.response_bytes(status, out, b"".join(chunks))


async def _main(port: int) -> None:
    from granian.constants import Interfaces
    from granian.server.embed import Server
    from null_app import app

    await app.start()
    await app.wait_ready()
    server = Server(
        RsgiApp(app),
        address="127.0.0.1",
        port=port,
        interface=Interfaces.RSGI,
        runtime_threads=1,
        websockets=False,
        backlog=2048,
        log_enabled=False,
    )
    await server.serve()


if __name__ == "__main__":
    import argparse

    import uvloop

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8002)
    uvloop.run(_main(parser.parse_args().port))
