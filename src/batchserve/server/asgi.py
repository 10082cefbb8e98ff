"""The few ASGI primitives the server needs, with no framework in between.

The server is a bare ASGI application: measured on a trivial endpoint, a framework's routing
and request objects cost more per request than they save here (see
``bench/framework_overhead.py``), and a bare app reads ``http.disconnect`` directly, which
is how a caller who leaves gets its queued work cancelled.

* :func:`check_body_type` refuses (415) a body whose ``Content-Type`` or
  ``Content-Encoding`` the endpoint cannot read, before reading it.
* :func:`read_body` reads the request body under a byte limit (413 before reading a body
  whose ``Content-Length`` is already over it) and a time limit (408: a client that sends
  its body slowly, or stops half way, holds nothing for long); a client that disconnects
  half way raises :class:`ClientGone`.
* :func:`send` answers a status, headers and a body in one go.
* :func:`watch_disconnect` waits for the client to leave after its body was read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any, TypeAlias

from batchserve.server.statuses import ApiError

__all__ = [
    "JSON_TYPE",
    "ClientGone",
    "Headers",
    "Receive",
    "Scope",
    "Send",
    "check_body_type",
    "get_header",
    "json_bytes",
    "load_json",
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


class ClientGone(Exception):
    """The client disconnected before its request's body had arrived whole."""


def check_body_type(scope: Scope, accepted: Collection[str]) -> None:
    """Refuse a body this endpoint cannot read, before reading it.

    A missing ``Content-Type`` is accepted (the body is parsed as JSON, and refused 400 if
    it is not); otherwise its media type (parameters such as ``charset`` ignored) must be
    one of ``accepted`` or end in ``+json`` when JSON is accepted. ``Content-Encoding``
    must be absent or ``identity``: compressed bodies are not read.

    Raises:
        ApiError: ``unsupported_media_type`` (415) naming the header and its value.
    """
    ctype = get_header(scope, b"content-type")
    if ctype is not None:
        media = ctype.split(";", 1)[0].strip().lower()
        json_ok = "application/json" in accepted and media.endswith("+json")
        if media not in accepted and not json_ok:
            raise ApiError(
                "unsupported_media_type",
                f"Content-Type must be {' or '.join(sorted(accepted))}, got {ctype!r}",
                param="Content-Type",
            )
    encoding = get_header(scope, b"content-encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        raise ApiError(
            "unsupported_media_type",
            f"Content-Encoding must be identity (send the body uncompressed), got {encoding!r}",
            param="Content-Encoding",
        )


def get_header(scope: Scope, name: bytes) -> str | None:
    """The value of header ``name`` (lower case bytes) in ``scope``, or None."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def json_bytes(obj: Any) -> bytes:
    """Compact JSON, UTF-8.

    A lone surrogate (a client may send half of an escaped UTF-16 pair, and messages may quote
    it) cannot be UTF-8: it is written as its JSON escape instead of failing.
    """
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "backslashreplace"
    )


def load_json(body: bytes) -> Any:
    """Parse a JSON request body.

    Raises:
        ApiError: ``malformed`` (400): not UTF-8, not JSON, or nested so deeply that the
            parser gives up (it recurses; a deep body must not reach the server's limit).
    """
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError("malformed", f"body must be valid JSON: {exc}", param="body") from None
    except RecursionError:
        raise ApiError(
            "malformed", "body must be valid JSON: it is nested too deeply", param="body"
        ) from None


async def read_body(
    scope: Scope, receive: Receive, limit: int, timeout_s: float | None = None
) -> bytes:
    """The whole request body, at most ``limit`` bytes, within ``timeout_s`` seconds.

    Raises:
        ApiError: ``too_large`` (413) once the body (or its declared length) exceeds
            ``limit``; ``malformed`` (400) if ``Content-Length`` is not a number;
            ``request_timeout`` (408, the connection is then closed) if the whole body has
            not arrived ``timeout_s`` seconds after the call.
        ClientGone: the client disconnected before the body was whole.
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
