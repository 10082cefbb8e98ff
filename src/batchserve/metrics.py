"""Prometheus metrics of a server, per model, through ``prometheus-client``.

Theory of operation: two kinds of sources.

* Events, recorded as they happen: each inference request's arrival
  (:meth:`Metrics.observe_received`), its outcome and end-to-end latency
  (:meth:`Metrics.observe_request`), and each forward pass's batch size, forward time and
  its items' queue waits (:meth:`Metrics.observe_batch`, fed by the batcher's ``on_batch``).
* State, read at scrape time from each model's frozen ``statistics()`` snapshot: queue
  depth, running items, items by outcome as the batching policy counts them, and the fitted
  cost model ``t(n) = fixed + n * per_item``. Nothing is polled between scrapes.

Request-level outcomes add up: at every instant ``batchserve_requests_received_total ==
sum(batchserve_requests_total) + batchserve_requests_in_flight``, where the outcomes are
``ok``, ``late``, ``rejected``, ``expired``, ``cancelled``, ``failed`` and ``invalid`` (see
:data:`OUTCOME_OF_REASON`). A request is received when it reaches an inference endpoint,
before its body is read; requests to unknown routes are not inference requests.

Every :class:`Metrics` has its own registry, so several servers (or tests) in one process
do not share counters. Names (labelled ``model`` unless said otherwise):

=========================================  =========  ======================================
name                                       type       what
=========================================  =========  ======================================
batchserve_requests_received_total         counter    inference requests received (no label)
batchserve_requests_total                  counter    inference requests by ``outcome``, ``reason``
batchserve_requests_in_flight              gauge      received, not yet answered (no label)
batchserve_event_loop_tasks                gauge      asyncio tasks alive (no label; leak check)
batchserve_request_duration_seconds        histogram  latency of successes, by ``protocol``
batchserve_queue_wait_seconds              histogram  admission to start of forward pass
batchserve_batch_size                      histogram  items per forward pass
batchserve_forward_seconds                 histogram  duration of each forward pass
batchserve_items_total                     counter    items by policy ``outcome``
batchserve_bisect_calls_total              counter    extra model calls isolating bad inputs
batchserve_queue_depth                     gauge      items waiting now
batchserve_running_items                   gauge      items in forward passes now
batchserve_cost_fixed_seconds              gauge      fitted fixed cost per pass
batchserve_cost_per_item_seconds           gauge      fitted cost per item
batchserve_cost_samples                    gauge      passes the cost model learned from
batchserve_model_ready                     gauge      1 when the model serves
=========================================  =========  ======================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from batchserve.batcher import BatchRecord
from batchserve.policy import PolicyStats

__all__ = ["CONTENT_TYPE", "OUTCOME_OF_REASON", "REQUEST_OUTCOMES", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: The request outcome a response reason counts as. ``deadline_exceeded`` is ``expired``
#: when the deadline passed in the queue and ``late`` when it passed during the forward pass
#: (the caller says which, see :meth:`Metrics.observe_request`); a reason not listed here (a
#: fault of the server, ``internal``) counts as ``failed``.
OUTCOME_OF_REASON = {
    "ok": "ok",
    "queue_full": "rejected",
    "infeasible": "rejected",
    "draining": "rejected",
    "not_ready": "rejected",
    "deadline_exceeded": "expired",
    "cancelled": "cancelled",
    "model_error": "failed",
    "malformed": "invalid",
    "invalid": "invalid",
    "too_large": "invalid",
    "unauthorized": "invalid",
    "not_found": "invalid",
    "method_not_allowed": "invalid",
    "unsupported_media_type": "invalid",
    "request_timeout": "invalid",
    "internal": "failed",
}

#: Every request outcome, in the order of the identity above.
REQUEST_OUTCOMES = ("ok", "late", "rejected", "expired", "cancelled", "failed", "invalid")

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

StatsSource = Callable[[], PolicyStats | None]


def _task_count() -> float:
    # Scrapes are answered on the server's loop; outside a loop there is nothing to count.
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:
        return 0.0


class _StateCollector:
    """Reads each model's statistics() at scrape time."""

    def __init__(self) -> None:
        self.sources: dict[str, tuple[StatsSource, Callable[[], bool]]] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        items = CounterMetricFamily(
            "batchserve_items", "Items by batching-policy outcome.", labels=["model", "outcome"]
        )
        depth = GaugeMetricFamily("batchserve_queue_depth", "Items waiting now.", labels=["model"])
        running = GaugeMetricFamily(
            "batchserve_running_items", "Items in forward passes now.", labels=["model"]
        )
        fixed = GaugeMetricFamily(
            "batchserve_cost_fixed_seconds",
            "Fitted cost model: seconds per forward pass.",
            labels=["model"],
        )
        per_item = GaugeMetricFamily(
            "batchserve_cost_per_item_seconds",
            "Fitted cost model: seconds per item.",
            labels=["model"],
        )
        samples = GaugeMetricFamily(
            "batchserve_cost_samples", "Passes the cost model learned from.", labels=["model"]
        )
        bisect = CounterMetricFamily(
            "batchserve_bisect_calls",
            "Extra model calls spent isolating the inputs that made a batch raise.",
            labels=["model"],
        )
        ready = GaugeMetricFamily(
            "batchserve_model_ready", "1 when the model serves.", labels=["model"]
        )
        for name, (stats_fn, ready_fn) in self.sources.items():
            ready.add_metric([name], 1.0 if ready_fn() else 0.0)
            stats = stats_fn()
            if stats is None:
                continue
            c = stats.counters
            for outcome, value in (
                ("ok", c.ok),
                ("late", c.late),
                ("expired", c.expired),
                ("cancelled", c.cancelled),
                ("failed", c.failed),
            ):
                items.add_metric([name, outcome], value)
            for reason, value in c.rejected.items():
                items.add_metric([name, f"rejected_{reason}"], value)
            depth.add_metric([name], stats.queue_depth)
            running.add_metric([name], stats.running_items)
            fixed.add_metric([name], stats.cost.fixed_s)
            per_item.add_metric([name], stats.cost.per_item_s)
            samples.add_metric([name], stats.cost_samples)
            bisect.add_metric([name], stats.bisect_calls)
        yield from (items, depth, running, fixed, per_item, samples, ready, bisect)


class Metrics:
    """The server's Prometheus collectors, in a registry of their own.

    Args:
        registry: where to register (a new one by default).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self._received = Counter(
            "batchserve_requests_received",
            "Inference requests received, counted on arrival before anything is read.",
            registry=reg,
        )
        self._requests = Counter(
            "batchserve_requests",
            "Inference requests by outcome and reason.",
            ["model", "outcome", "reason"],
            registry=reg,
        )
        self._in_flight = Gauge(
            "batchserve_requests_in_flight",
            "Inference requests received and not yet answered.",
            registry=reg,
        )
        self._tasks = Gauge(
            "batchserve_event_loop_tasks",
            "asyncio tasks alive on the server's event loop (a leak shows as growth).",
            registry=reg,
        )
        self._tasks.set_function(_task_count)
        self._latency = Histogram(
            "batchserve_request_duration_seconds",
            "End-to-end latency of successful inference requests, arrival to response.",
            ["model", "protocol"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self._queue_wait = Histogram(
            "batchserve_queue_wait_seconds",
            "Seconds from admission to the start of the item's forward pass.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self._batch_size = Histogram(
            "batchserve_batch_size",
            "Items per forward pass.",
            ["model"],
            buckets=_SIZE_BUCKETS,
            registry=reg,
        )
        self._forward = Histogram(
            "batchserve_forward_seconds",
            "Duration of each forward pass.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self._state = _StateCollector()
        reg.register(self._state)
        self._children: dict[tuple[str, ...], Any] = {}

    def add_model(self, name: str, stats: StatsSource, ready: Callable[[], bool]) -> None:
        """Report ``name``'s state at each scrape from ``stats()`` and ``ready()``."""
        self._state.sources[name] = (stats, ready)

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_received(self) -> None:
        """Count an inference request on arrival; it is in flight until its outcome."""
        self._received.inc()
        self._in_flight.inc()

    def observe_request(
        self,
        model: str,
        protocol: str,
        reason: str,
        seconds: float | None,
        *,
        outcome: str | None = None,
    ) -> None:
        """Count one inference request's outcome (``reason`` ``ok`` for a success).

        Args:
            model: the model it asked for ("" when that was never known).
            protocol: ``openai`` or ``kserve``.
            reason: the response's reason (``ok``, or a key of the status table).
            seconds: its end-to-end latency, recorded in the histogram when given.
            outcome: overrides :data:`OUTCOME_OF_REASON` (``late`` for a deadline that
                passed during the forward pass).
        """
        if outcome is None:
            outcome = OUTCOME_OF_REASON.get(reason, "failed")
        self._child(self._requests, model, outcome, reason).inc()
        self._in_flight.dec()
        if seconds is not None:
            self._child(self._latency, model, protocol).observe(seconds)

    def observe_batch(self, model: str, record: BatchRecord) -> None:
        """Record one finished forward pass (a batcher's ``on_batch``)."""
        if record.size == 0:
            return
        self._child(self._batch_size, model).observe(record.size)
        self._child(self._forward, model).observe(record.forward_s)
        wait = self._child(self._queue_wait, model)
        for w in record.queue_waits_s:
            wait.observe(w)

    def exposition(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
