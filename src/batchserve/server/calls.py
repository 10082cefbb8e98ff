"""The steps every inference call shares: API key, deadline, disconnect watch, headers.

* :func:`authorize` checks ``Authorization: Bearer <key>`` (401 ``unauthorized``).
* :func:`request_deadline` is the tighter of ``X-Request-Timeout`` (seconds, ``0.25``, or
  with a unit, ``250ms``) and the protocol's own timeout (KServe ``parameters.timeout``) when
  the request gives them, else the model's default, counted from the request's arrival, on
  the batcher's clock.
* :func:`compute` hands the inputs to the model's batcher while a watcher reads
  ``http.disconnect``: a client that leaves cancels the waiting handler, its inputs are
  withdrawn (queued ones never reach the model) and the call returns None.
* :func:`timing_headers` are the answer's ``X-Queue-Wait-S``, ``X-Batch-Size``,
  ``X-Batch-Id`` and ``X-Forward-S``.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from batchserve.batcher import Served
from batchserve.server.asgi import Headers, Receive, Scope, get_header, watch_disconnect
from batchserve.server.registry import ServedModel
from batchserve.server.statuses import ApiError
from batchserve.units import parse_duration

__all__ = ["authorize", "compute", "request_deadline", "timing_headers"]


def timing_headers(served: list[Served[Any]]) -> Headers:
    """The timing headers of an answer: one comma-separated value per input, in order.

    ``X-Queue-Wait-S``, ``X-Batch-Size``, ``X-Batch-Id`` and ``X-Forward-S``.
    """
    return [
        (b"x-queue-wait-s", ",".join(f"{s.queue_wait_s:.6f}" for s in served).encode()),
        (b"x-batch-size", ",".join(str(s.batch_size) for s in served).encode()),
        (b"x-batch-id", ",".join(str(s.batch_id) for s in served).encode()),
        (b"x-forward-s", ",".join(f"{s.forward_s:.6f}" for s in served).encode()),
    ]


def authorize(scope: Scope, key: bytes | None) -> None:
    """Raise 401 ``unauthorized`` unless ``key`` is None or the request carries it."""
    if key is None:
        return
    given = get_header(scope, b"authorization") or ""
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
        raise ApiError(
            "unauthorized",
            "this endpoint needs the header 'Authorization: Bearer <api key>'"
            + (" (the key given is wrong)" if given else ""),
            param="Authorization",
        )


def request_deadline(scope: Scope, model: ServedModel, start: float, extra: float | None) -> float:
    """The request's absolute deadline (see the module docstring).

    Raises:
        ApiError: ``invalid`` when ``X-Request-Timeout`` is not a positive duration.
    """
    timeouts = [] if extra is None else [extra]
    header = get_header(scope, b"x-request-timeout")
    if header is not None:
        try:
            t = parse_duration(header, name="X-Request-Timeout", default_unit="s")
        except ValueError as exc:
            raise ApiError("invalid", str(exc), param="X-Request-Timeout") from None
        if t <= 0:
            raise ApiError(
                "invalid", f"X-Request-Timeout must be > 0, got {header!r}", "X-Request-Timeout"
            )
        timeouts.append(t)
    return model.deadline_for(min(timeouts) if timeouts else None, start)


async def compute(
    model: ServedModel, items: list[Any], deadline: float, receive: Receive
) -> list[Served[Any]] | None:
    """Run ``items``; None if the client disconnected (its inputs were withdrawn)."""
    task = asyncio.current_task()
    assert task is not None
    left = False

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        nonlocal left
        if not watcher.cancelled() and watcher.exception() is None:
            left = True
            task.cancel()

    watcher = asyncio.ensure_future(watch_disconnect(receive))
    watcher.add_done_callback(on_disconnect)
    try:
        return await model.infer(items, deadline)
    except asyncio.CancelledError:
        if left and task.uncancel() == 0:
            return None
        raise
    finally:
        watcher.remove_done_callback(on_disconnect)
        watcher.cancel()
