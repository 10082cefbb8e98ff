"""The one table from outcomes to HTTP status codes.

Every error response of the server is an :class:`ApiError`: a status, a machine-readable
reason (sent as the ``X-Reason`` header and as OpenAI's ``code``), a message that names the
field, the rule and the value, and for refusals a ``retry_after_s``. :data:`STATUS_TABLE` is
the only place that says which reason gets which status, and :func:`from_exception` the only
place that turns the core's exceptions (which know nothing of HTTP) into those reasons.

======================  ======  ===========================================================
reason                  status  when
======================  ======  ===========================================================
queue_full              429     the model's bounded queue is full (Retry-After)
infeasible              429     the cost model predicts the deadline cannot be met (Retry-After)
draining                503     the server is shutting down and admits nothing (Retry-After)
not_ready               503     the model is still loading (Retry-After)
deadline_exceeded       504     the deadline passed while the request was queued or running
malformed               400     the body is not valid JSON (or not a valid binary tensor body)
request_timeout         408     the head or body did not arrive within the read timeout (slow
                                client); the connection is closed
unsupported_media_type  415     a Content-Type or Content-Encoding the endpoint does not read
head_too_large          431     the request line and headers are over 64 KiB (the connection
                                is closed; answered below the app, see server.guard)
invalid                 422     a field has the wrong type or breaks a rule (empty input...)
wrong_kind              400     the route is not one the model's kind answers (the message names
                                the model's kind and the route to use)
empty                   400     a list that must hold something is empty (TEI's ``empty``)
too_large               413     body bytes, inputs per request or characters per input over limit
model_error             422     the model raised for this input, isolated by bisection
unauthorized            401     an API key is required and missing or wrong
not_found               404     no such route or model
method_not_allowed      405     the route exists for another method
internal                500     a fault of the server itself (including a model that broke the
                                one-output-per-input contract)
======================  ======  ===========================================================

Over gRPC (:mod:`batchserve.server.transport.grpc`) the same reasons answer with the status
codes of :data:`GRPC_TABLE`, derived from nothing else: one reason, one HTTP status, one gRPC
code. The reason and the retry delay travel as trailing metadata (``x-reason``,
``retry-after``, ``retry-after-ms``), named like the HTTP headers.

======================  ======================  ==================================================
reason                  gRPC code               why this code
======================  ======================  ==================================================
queue_full              RESOURCE_EXHAUSTED      refused for load; retry after ``retry-after-ms``
infeasible              RESOURCE_EXHAUSTED      refused for load; retry after ``retry-after-ms``
draining                UNAVAILABLE             this server will not take it; another replica may
not_ready               UNAVAILABLE             the model is loading; retry after ``retry-after-ms``
deadline_exceeded       DEADLINE_EXCEEDED       the call's deadline passed
malformed               INVALID_ARGUMENT        the message's bytes or tensors are not readable
request_timeout         DEADLINE_EXCEEDED       (HTTP only: gRPC reads whole messages)
unsupported_media_type  INVALID_ARGUMENT        (HTTP only)
head_too_large          RESOURCE_EXHAUSTED      as grpcio answers metadata over its limit
invalid                 INVALID_ARGUMENT        a field breaks a rule (the message names it)
wrong_kind              INVALID_ARGUMENT        the model's kind does not answer this call
empty                   INVALID_ARGUMENT        a list that must hold something is empty
too_large               INVALID_ARGUMENT        inputs or characters over a limit (a message over
                                                the size limit is grpcio's RESOURCE_EXHAUSTED)
model_error             INVALID_ARGUMENT        Triton answers an input a model cannot process as
                                                its INVALID_ARG, which it sends as HTTP 400 and
                                                gRPC INVALID_ARGUMENT: 422 is that class here
unauthorized            UNAUTHENTICATED         no or a wrong key in ``authorization`` metadata
not_found               NOT_FOUND               no such model (or version)
method_not_allowed      UNIMPLEMENTED           (HTTP only)
internal                INTERNAL                a fault of the server itself
======================  ======================  ==================================================
"""

from __future__ import annotations

import asyncio
import math

from batchserve.errors import (
    DeadlineExceeded,
    ModelError,
    NotReady,
    OutputMismatch,
    Rejected,
)

__all__ = [
    "GRPC_TABLE",
    "STATUS_TABLE",
    "ApiError",
    "from_exception",
    "retry_after_headers",
    "retry_after_ms",
]

#: reason -> (HTTP status, when it happens). The only table from outcome to status.
STATUS_TABLE: dict[str, tuple[int, str]] = {
    "queue_full": (429, "the model's bounded queue is full"),
    "infeasible": (429, "the cost model predicts the deadline cannot be met"),
    "draining": (503, "the server is shutting down and admits no new work"),
    "not_ready": (503, "the model is still loading"),
    "deadline_exceeded": (504, "the deadline passed while the request was queued or running"),
    "malformed": (400, "the body is not valid JSON or not a valid binary tensor body"),
    "request_timeout": (408, "the head or body did not arrive within the read timeout"),
    "unsupported_media_type": (415, "a Content-Type or Content-Encoding the endpoint cannot read"),
    "head_too_large": (431, "the request line and headers are over the limit"),
    "invalid": (422, "a field has the wrong type or breaks a rule"),
    "wrong_kind": (400, "the route is not one the model's kind answers"),
    "empty": (400, "a list that must hold something is empty"),
    "too_large": (413, "body bytes, inputs per request or characters per input over the limit"),
    "model_error": (422, "the model raised for this input (isolated by bisection)"),
    "unauthorized": (401, "an API key is required and is missing or wrong"),
    "not_found": (404, "no such route or model"),
    "method_not_allowed": (405, "the route exists for another method"),
    "internal": (500, "a fault of the server itself"),
}

#: reason -> gRPC status code (the name of a ``grpc.StatusCode`` member: this module does not
#: import grpcio, an optional extra). The same keys as :data:`STATUS_TABLE` (a test checks).
GRPC_TABLE: dict[str, str] = {
    "queue_full": "RESOURCE_EXHAUSTED",
    "infeasible": "RESOURCE_EXHAUSTED",
    "draining": "UNAVAILABLE",
    "not_ready": "UNAVAILABLE",
    "deadline_exceeded": "DEADLINE_EXCEEDED",
    "malformed": "INVALID_ARGUMENT",
    "request_timeout": "DEADLINE_EXCEEDED",
    "unsupported_media_type": "INVALID_ARGUMENT",
    "head_too_large": "RESOURCE_EXHAUSTED",
    "invalid": "INVALID_ARGUMENT",
    "wrong_kind": "INVALID_ARGUMENT",
    "empty": "INVALID_ARGUMENT",
    "too_large": "INVALID_ARGUMENT",
    "model_error": "INVALID_ARGUMENT",
    "unauthorized": "UNAUTHENTICATED",
    "not_found": "NOT_FOUND",
    "method_not_allowed": "UNIMPLEMENTED",
    "internal": "INTERNAL",
}

#: Reasons that are refusals: the response carries Retry-After and Retry-After-Ms.
RETRY_REASONS = frozenset({"queue_full", "infeasible", "draining", "not_ready"})


class ApiError(Exception):
    """An error answered to the client.

    Args:
        reason: a key of :data:`STATUS_TABLE`; it decides the status.
        message: what went wrong; names the field, the rule and the value.
        param: the offending field (``input``, ``input[3]``, ``X-Request-Timeout``...).
        retry_after_s: for refusals, when a retry may be admitted.
        allow: for 405, the methods the route takes (sent as ``Allow``, as RFC 9110 asks).

    Raises:
        KeyError: ``reason`` is not in the table (a bug of the server).
    """

    def __init__(
        self,
        reason: str,
        message: str,
        param: str | None = None,
        *,
        retry_after_s: float | None = None,
        allow: str | None = None,
    ) -> None:
        super().__init__(message)
        self.allow = allow
        self.status = STATUS_TABLE[reason][0]
        self.reason = reason
        self.message = message
        self.param = param
        if retry_after_s is None and reason in RETRY_REASONS:
            retry_after_s = 1.0
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        """``X-Reason`` and, for refusals, ``Retry-After`` and ``Retry-After-Ms``.

        A 408 also closes the connection: the rest of its body may still be on the way.
        """
        out = [(b"x-reason", self.reason.encode())]
        if self.retry_after_s is not None:
            out.extend(retry_after_headers(self.retry_after_s))
        if self.status == 401:
            out.append((b"www-authenticate", b"Bearer"))
        if self.status == 408:
            out.append((b"connection", b"close"))
        if self.allow is not None:
            out.append((b"allow", self.allow.encode()))
        return out


def retry_after_ms(retry_after_s: float) -> int:
    """``Retry-After-Ms``: milliseconds, rounded up, at least 1."""
    return max(1, math.ceil(retry_after_s * 1000))


def retry_after_headers(retry_after_s: float) -> list[tuple[bytes, bytes]]:
    """``Retry-After`` in whole seconds (rounded up, at least 1) and ``Retry-After-Ms``."""
    seconds = max(1, math.ceil(retry_after_s))
    millis = retry_after_ms(retry_after_s)
    return [(b"retry-after", str(seconds).encode()), (b"retry-after-ms", str(millis).encode())]


def from_exception(exc: BaseException) -> ApiError:
    """The :class:`ApiError` a core exception is answered with.

    ``Rejected`` keeps its own reason (``queue_full``, ``infeasible``, ``draining``) and
    ``retry_after_s``; ``NotReady`` is ``not_ready``; ``DeadlineExceeded`` (raised by the
    batcher, or an asyncio timeout) is ``deadline_exceeded``; ``OutputMismatch`` (the model
    broke its contract) is ``internal``; any other ``ModelError`` is ``model_error``;
    anything else is ``internal``.
    """
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, Rejected):
        return ApiError(exc.reason, str(exc), retry_after_s=exc.retry_after_s)
    if isinstance(exc, NotReady):
        return ApiError("not_ready", str(exc), retry_after_s=exc.retry_after_s)
    if isinstance(exc, DeadlineExceeded | asyncio.TimeoutError):
        return ApiError("deadline_exceeded", str(exc) or "the deadline passed")
    if isinstance(exc, OutputMismatch):
        return ApiError("internal", f"the model broke its contract: {exc}")
    if isinstance(exc, ModelError):
        return ApiError("model_error", str(exc))
    return ApiError("internal", f"internal server error: {type(exc).__name__}")
