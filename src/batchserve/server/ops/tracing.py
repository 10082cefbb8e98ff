"""OpenTelemetry traces, when asked for (``--otel``, the ``otel`` extra): off costs nothing.

Theory of operation
-------------------
Off (the default), nothing here is imported and the request path is untouched: the app
opens plain :class:`~batchserve.server.exchange.Exchange` objects and its batchers report
passes to the metrics alone.

On, the app opens :class:`TracedExchange` objects instead, and :class:`Tracing` listens to
every finished pass beside the metrics:

* each inference request is one span, ``batchserve.request``, from its arrival (its first
  byte) to its answer, with the model, the protocol, the reason it ended (``ok`` or an
  error's reason), its HTTP status and inputs, and how it was served: for one input the
  attributes ``batchserve.queue_wait_s``, ``batchserve.batch_id``, ``batchserve.batch_size``
  and ``batchserve.forward_s``; for several, the same names hold one value per input, in
  input order (as the response headers do);
* each forward pass is one span, ``batchserve.pass``, over the pass's own time, with the
  model, batch id, size, forward time, failed and skipped items, and a **link to the span
  of every request it served**. The batcher answers a pass's items before it reports the
  pass, and a request's span exists from its arrival, so by then every request the pass
  served has registered its span under the pass's id; the pass takes them and forgets them.

A request that carries a W3C ``traceparent`` header is not a child of its caller's span
yet: the server reads only the headers it needs. Spans go to the global tracer provider if
the process has one (``opentelemetry-instrument`` sets it up), else to one built here that
exports over OTLP/HTTP as the standard ``OTEL_EXPORTER_OTLP_*`` variables say
(``OTEL_TRACES_EXPORTER=console`` prints them instead, ``none`` drops them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from batchserve.batcher import BatchRecord, Served
from batchserve.server.exchange import Endpoint, Exchange, Host, Reply
from batchserve.server.statuses import STATUS_TABLE

__all__ = ["TracedExchange", "Tracing", "default_tracer"]

_INSTRUMENTATION = "batchserve"


def default_tracer() -> Any:
    """The tracer spans go to: the global provider's, or one exporting as OTEL_* say.

    Raises:
        ImportError: the ``otel`` extra is missing (the message names the pip command).
    """
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise ImportError("--otel needs OpenTelemetry: pip install 'batchserve[otel]'") from None
    import os

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # nobody set one up: ours
        provider = TracerProvider(resource=Resource.create({"service.name": "batchserve"}))
        kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
        if kind == "none":  # spans are made and dropped (to measure their cost)
            trace.set_tracer_provider(provider)
            return provider.get_tracer(_INSTRUMENTATION)
        if kind == "console":
            exporter: Any = ConsoleSpanExporter()
        else:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError:
                raise ImportError(
                    "--otel exports over OTLP/HTTP: pip install 'batchserve[otel]' "
                    "(or set OTEL_TRACES_EXPORTER=console)"
                ) from None
            exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    return provider.get_tracer(_INSTRUMENTATION)


def _unix_ns(monotonic_s: float) -> int:
    """A monotonic time as Unix nanoseconds (what spans are stamped with)."""
    return time.time_ns() - round((time.monotonic() - monotonic_s) * 1e9)


class Tracing:
    """The spans of one app: request spans opened by its exchanges, pass spans here.

    Args:
        tracer: an OpenTelemetry tracer (see :func:`default_tracer`).
    """

    def __init__(self, tracer: Any) -> None:
        from opentelemetry.trace import Link

        self.tracer = tracer
        self._link = Link
        #: (model, batch id) -> the span contexts of the requests the pass served.
        self.pending: dict[tuple[str, int], list[Any]] = {}

    def on_batch(self, model: str, record: BatchRecord) -> None:
        """A finished pass (a batcher's ``on_batch``): its span, linking its requests."""
        contexts = self.pending.pop((model, record.batch_id), [])
        if record.size == 0:
            return
        # A request with several inputs in this pass registered once per input: one link.
        unique = {c.span_id: c for c in contexts}
        end = time.time_ns()
        span = self.tracer.start_span(
            "batchserve.pass",
            start_time=end - round(record.forward_s * 1e9),
            links=[self._link(c) for c in unique.values()],
            attributes={
                "batchserve.model": model,
                "batchserve.batch_id": record.batch_id,
                "batchserve.batch_size": record.size,
                "batchserve.forward_s": record.forward_s,
                "batchserve.failed": record.failed,
                "batchserve.skipped": record.skipped,
                "batchserve.bisect_calls": record.bisect_calls,
            },
        )
        span.end(end_time=end)


class TracedExchange(Exchange):
    """An :class:`Exchange` that is also a span, from its arrival to its answer."""

    __slots__ = ("span", "tracing")

    def __init__(
        self,
        app: Host,
        endpoint: Endpoint,
        head: Any,
        arrival: float,
        respond: Callable[[Reply], None] | None,
        *,
        tracing: Tracing,
    ) -> None:
        super().__init__(app, endpoint, head, arrival, respond)
        self.tracing = tracing
        self.span = tracing.tracer.start_span(
            "batchserve.request",
            start_time=_unix_ns(arrival),
            attributes={"batchserve.protocol": endpoint.protocol},
        )

    def settle(self, index: int, served: Served[Any] | None, error: BaseException | None) -> None:
        """As :meth:`Exchange.settle`; a served input registers this span with its pass."""
        model = self.model
        tracing = self.tracing
        if served is not None and model is not None:
            key = (model.name, served.batch_id)
            tracing.pending.setdefault(key, []).append(self.span.get_span_context())
        super().settle(index, served, error)

    def _count(self, reason: str, outcome: str | None, elapsed: float) -> None:
        super()._count(reason, outcome, elapsed)
        span = self.span
        model = self.model
        attributes: dict[str, Any] = {
            "batchserve.reason": reason,
            "batchserve.inputs": len(self.results),
        }
        if model is not None:
            attributes["batchserve.model"] = model.name
        status = 200 if reason == "ok" else STATUS_TABLE.get(reason, (499, ""))[0]
        attributes["http.response.status_code"] = status
        served = [s for s in self.results if s is not None]
        if served:
            one = len(served) == 1
            for name, values in (
                ("batchserve.queue_wait_s", [s.queue_wait_s for s in served]),
                ("batchserve.batch_id", [s.batch_id for s in served]),
                ("batchserve.batch_size", [s.batch_size for s in served]),
                ("batchserve.forward_s", [s.forward_s for s in served]),
            ):
                attributes[name] = values[0] if one else values
        span.set_attributes(attributes)
        if reason != "ok":
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, reason))
        span.end()
