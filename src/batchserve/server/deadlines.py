"""A request's deadline, from the wire: the tightest of what its headers say.

A request may state its deadline in any of these headers; the tightest wins, and it counts
from the request's arrival (its first byte), not from when the server got round to it:

=================================  =========================================================
header                             meaning
=================================  =========================================================
``X-Request-Timeout``              seconds (``0.25``) or a duration with a unit (``250ms``)
``X-Request-Deadline``             an absolute time, Unix epoch seconds (``1767225600.25``),
                                   for callers whose clocks are synchronised with the server's
``grpc-timeout``                   gRPC's form: up to 8 digits and a unit, ``H`` ``M`` ``S``
                                   ``m`` (ms) ``u`` (µs) ``n`` (ns), e.g. ``250m``
``x-envoy-expected-rq-timeout-ms``  what Envoy expects the request to take, whole milliseconds
                                   (``0``: Envoy has no timeout for the route; ignored)
=================================  =========================================================

The protocol's own timeout (KServe's ``parameters.timeout``) is added when the body is parsed;
with none of them the model's default (``--timeout``) applies. A value that breaks its
header's rule is answered 422 ``invalid`` naming the header.
"""

from __future__ import annotations

import math
import re
import time

from batchserve.errors import ConfigError
from batchserve.server.statuses import ApiError
from batchserve.units import parse_duration

__all__ = [
    "DEADLINE_HEADERS",
    "GRPC_TIMEOUT_PATTERN",
    "TIMEOUT_HEADER",
    "WHEN_HEADER",
    "wire_deadline",
]

#: The request header of a deadline relative to arrival, and of an absolute one.
TIMEOUT_HEADER = "X-Request-Timeout"
WHEN_HEADER = "X-Request-Deadline"

#: The request headers that bound a request's deadline (lower case), and their rule.
DEADLINE_HEADERS: dict[bytes, str] = {
    TIMEOUT_HEADER.lower().encode(): "seconds > 0, or a duration with a unit (250ms)",
    WHEN_HEADER.lower().encode(): "Unix epoch seconds (a finite number)",
    b"grpc-timeout": "1 to 8 digits and a unit H, M, S, m, u or n (250m)",
    b"x-envoy-expected-rq-timeout-ms": "whole milliseconds >= 0",
}

#: A ``grpc-timeout`` value (gRPC over HTTP/2: "TimeoutValue TimeoutUnit"): the one rule,
#: which the OpenAPI document publishes too.
GRPC_TIMEOUT_PATTERN = r"^([0-9]{1,8})([HMSmun])$"
_GRPC = re.compile(GRPC_TIMEOUT_PATTERN)
_GRPC_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def _invalid(name: bytes, raw: bytes) -> ApiError:
    header = name.decode()
    shown = raw.decode("latin-1")
    return ApiError(
        "invalid",
        f"{header} must be {DEADLINE_HEADERS[name]}, got {shown!r}",
        param=header,
    )


def _timeout(name: bytes, raw: bytes) -> float | None:
    """Seconds from arrival that header ``name`` allows, or None when it sets no bound."""
    text = raw.decode("latin-1").strip()
    if name == b"x-request-timeout":
        try:
            t = parse_duration(text, name="X-Request-Timeout", default_unit="s")
        except ConfigError as exc:
            raise ApiError("invalid", str(exc), param="X-Request-Timeout") from None
        if t <= 0:
            raise ApiError(
                "invalid", f"X-Request-Timeout must be > 0, got {text!r}", "X-Request-Timeout"
            )
        return t
    if name == b"grpc-timeout":
        match = _GRPC.match(text)
        if match is None:
            raise _invalid(name, raw)
        return int(match.group(1)) * _GRPC_UNITS[match.group(2)]
    if not text.isdigit():  # x-envoy-expected-rq-timeout-ms
        raise _invalid(name, raw)
    millis = int(text)
    return millis / 1e3 if millis else None


def wire_deadline(headers: dict[bytes, bytes], arrival: float, now: float) -> float | None:
    """The tightest deadline the request's headers state, on the server's clock.

    Args:
        headers: the request's headers by lower-case name (only these are read).
        arrival: when the request's first byte arrived (on the server's clock).
        now: the time now on that clock (an epoch deadline is converted through it).

    Returns:
        The absolute deadline, or None when no header bounds it.

    Raises:
        ApiError: ``invalid`` naming the header whose value breaks its rule.
    """
    deadline: float | None = None
    for name in DEADLINE_HEADERS:
        raw = headers.get(name)
        if raw is None:
            continue
        if name == b"x-request-deadline":
            try:
                epoch = float(raw.decode("latin-1"))
            except ValueError:
                raise _invalid(name, raw) from None
            if not math.isfinite(epoch):
                raise _invalid(name, raw)
            candidate = now + (epoch - time.time())
        else:
            t = _timeout(name, raw)
            if t is None:
                continue
            candidate = arrival + t
        if deadline is None or candidate < deadline:
            deadline = candidate
    return deadline
