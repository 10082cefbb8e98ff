"""The few ASGI primitives the server needs, with no framework in between.

The server is a bare ASGI application: measured on a trivial endpoint, a framework's routing
and request objects cost more per request than they save here (see
``bench/framework_overhead.py``), and a bare app reads ``http.disconnect`` directly, which
is how a caller who leaves gets its queued work cancelled.

* :func:`read_body` reads the request body under a byte limit (413 before reading a body
  whose ``Content-Length`` is already over it).
* :func:`send` answers a status, headers and a body in one go.
* :func:`watch_disconnect` waits for the client to leave after its body was read.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeAlias

from batchserve.server.statuses import ApiError

__all__ = [
    "JSON_TYPE",
    "Headers",
    "Receive",
    "Scope",
    "Send",
    "get_header",
    "json_bytes",
    "read_body",
    "send",
    "watch_disconnect",
]

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
Headers: TypeAlias = list[tuple[bytes, bytes]]

JSON_TYPE = b"application/json"


def get_header(scope: Scope, name: bytes) -> str | None:
    """The value of header ``name`` (lower case bytes) in ``scope``, or None."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def json_bytes(obj: Any) -> bytes:
    """Compact JSON, UTF-8."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, at most ``limit`` bytes.

    Raises:
        ApiError: ``too_large`` (413) once the body (or its declared length) exceeds
            ``limit``; ``malformed`` (400) if ``Content-Length`` is not a number.
    """
    declared = get_header(scope, b"content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(
                "malformed", f"Content-Length must be an integer, got {declared!r}"
            ) from None
        if size > limit:
            raise ApiError(
                "too_large",
                f"body must be at most {limit} bytes (--max-body-bytes), Content-Length is {size}",
                param="body",
            )
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
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
