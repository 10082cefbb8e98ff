"""Prometheus metrics of a server, per model: plain counters on the hot path, exported at scrape.

Theory of operation: a request's path must not pay for monitoring, so nothing here takes a
lock, builds a label set or calls into ``prometheus-client`` per request. Events update plain
integers, dicts keyed by label tuples and bucket arrays:

* each inference request's arrival (:meth:`Metrics.observe_received`), its outcome and
  end-to-end latency (:meth:`Metrics.observe_request`);
* each forward pass's batch size, forward time and its items' queue waits
  (:meth:`Metrics.observe_batch`, fed by the batcher's ``on_batch``).

State is read at scrape time from each model's frozen ``statistics()`` snapshot: queue
depth, running items, items by outcome as the batching policy counts them, and the fitted
cost model ``t(n) = fixed + n * per_item``. A collector turns all of it into metric families
when ``/metrics`` is scraped; nothing is polled between scrapes. No series carries an empty
label value (a request whose model was never known is labelled ``model="_unknown"``, a name
no served model can have) and there are no ``*_created`` series.

The same counters answer the server's other views of itself, read on demand through
:meth:`Metrics.account` (a frozen :class:`Account` per model): Triton's statistics
extension (:mod:`batchserve.server.protocols.triton`) and the live status behind the dashboard
(:mod:`batchserve.server.ops.live`). For those, each pass also adds to its batch size's count
and forward time, and to two bounded windows of the latest forward times and queue waits
(quantiles of what is happening now, not since the start); all of it per pass, on the
batcher's ``on_batch``, never per request.

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
batchserve_running_items                   gauge      items dispatched: in passes, or prefetched
batchserve_cost_fixed_seconds              gauge      fitted fixed cost per pass
batchserve_cost_per_item_seconds           gauge      fitted cost per item
batchserve_cost_samples                    gauge      passes the cost model learned from
batchserve_model_info                      gauge      1 per model, with its ``kind`` and ``item``
batchserve_model_ready                     gauge      1 when the model serves
batchserve_batch_tokens_total              counter    tokens of passes, ``kind``: padded or real
batchserve_padding_waste_ratio             gauge      padded tokens / real tokens, since start
batchserve_cost_per_token_seconds          gauge      fitted cost per padded token
batchserve_class_items_total               counter    items by ``class``, ``tenant``, ``outcome``
batchserve_class_queue_depth               gauge      items waiting now, by ``class``
batchserve_queue_capacity                  gauge      items the queue holds at most (setting)
batchserve_max_batch_size                  gauge      items a pass holds at most (setting)
batchserve_default_deadline_seconds        gauge      deadline of a request stating none
=========================================  =========  ======================================

The three token metrics exist for models whose passes are formed by tokens. The two
``class`` metrics exist for models with classes of work. Their ``tenant`` label is a
configured tenant's name, or ``""`` for every other tenant, so the label set stays bounded.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.utils import floatToGoString

from batchserve.batcher import BatchRecord
from batchserve.config import BatchConfig
from batchserve.models.kinds import Kind, item_of
from batchserve.policy import Counters, PolicyStats
from batchserve.server.account import Account, Passes

__all__ = [
    "CONTENT_TYPE",
    "OUTCOME_OF_REASON",
    "REQUEST_OUTCOMES",
    "UNKNOWN_MODEL",
    "Metrics",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: The ``model`` label of a request whose model was never known (a 404, a body that did not
#: parse): model names start with a letter or digit, so no served model is called this.
UNKNOWN_MODEL = "_unknown"

#: The request outcome a response reason counts as. ``deadline_exceeded`` is ``expired``
#: when the deadline passed in the queue (or before admission) and ``late`` when it passed
#: during the forward pass (the caller says which, see :meth:`Metrics.observe_request`); a
#: reason not listed here (a fault of the server, ``internal``) counts as ``failed``.
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
    "wrong_kind": "invalid",
    "empty": "invalid",
    "unauthorized": "invalid",
    "not_found": "invalid",
    "method_not_allowed": "invalid",
    "unsupported_media_type": "invalid",
    "request_timeout": "invalid",
    "internal": "failed",
}

#: Every request outcome, in the order of the identity above.
REQUEST_OUTCOMES = ("ok", "late", "rejected", "expired", "cancelled", "failed", "invalid")

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

StatsSource = Callable[[], PolicyStats | None]
#: Counters by class then tenant label, and queue depth by class (None while loading).
ClassStatsSource = Callable[[], tuple[dict[str, dict[str, Counters]], dict[str, int]] | None]


class _Histogram:
    """Bucket counts and a sum: what one Prometheus histogram series needs, nothing more."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are "less than or equal": the first bound >= value.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def add_to(self, family: HistogramMetricFamily, labels: list[str]) -> None:
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            buckets.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]
        buckets.append(("+Inf", running + self.counts[-1]))
        family.add_metric(labels, buckets, sum_value=self.total)


def _task_count() -> float:
    # Scrapes are answered on the server's loop; outside a loop there is nothing to count.
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:
        return 0.0


class Metrics:
    """The server's metrics: plain counters updated per event, exported by a collector.

    Args:
        registry: where to register the collector (a new one by default).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.received = 0
        self.in_flight = 0
        #: (model, outcome, reason) -> requests.
        self.requests: dict[tuple[str, str, str], int] = {}
        self._latency: dict[tuple[str, str], _Histogram] = {}
        self._queue_wait: dict[str, _Histogram] = {}
        self._batch_size: dict[str, _Histogram] = {}
        self._forward: dict[str, _Histogram] = {}
        #: (model, outcome) -> seconds of the requests that ended so (all but ``ok``).
        self._other_s: dict[tuple[str, str], float] = {}
        self._passes: dict[str, Passes] = {}
        self._settings: dict[str, tuple[BatchConfig | None, float | None]] = {}
        self._sources: dict[str, tuple[StatsSource, Callable[[], bool]]] = {}
        self._class_sources: dict[str, ClassStatsSource] = {}
        self._kinds: dict[str, Callable[[], Kind | None]] = {}
        self.registry.register(self)

    def add_model(
        self,
        name: str,
        stats: StatsSource,
        ready: Callable[[], bool],
        *,
        config: BatchConfig | None = None,
        timeout_s: float | None = None,
        kind: Callable[[], Kind | None] | None = None,
    ) -> None:
        """Report ``name``'s state at each scrape from ``stats()`` and ``ready()``.

        ``config`` and ``timeout_s`` (its batcher's settings and default deadline) are
        exported too, so alerts can compare the queue with its size and latency with the
        deadline; ``kind()`` (the model's kind; None until loaded) as
        ``batchserve_model_info``, by its name, with what one item is
        (:func:`~batchserve.models.kinds.item_of`).
        """
        if kind is not None:
            self._kinds[name] = kind
        self._sources[name] = (stats, ready)
        self._settings[name] = (config, timeout_s)
        self._queue_wait[name] = _Histogram(_LATENCY_BUCKETS)
        self._batch_size[name] = _Histogram(_SIZE_BUCKETS)
        self._forward[name] = _Histogram(_LATENCY_BUCKETS)
        self._passes[name] = Passes()

    def add_classes(self, name: str, stats: ClassStatsSource) -> None:
        """Report ``name``'s outcomes and queue by class and tenant at each scrape.

        ``stats()`` gives the counters by class then tenant label, and the queue depth by
        class (or None while the model loads).
        """
        self._class_sources[name] = stats

    # -- events (the hot path) -------------------------------------------------------------

    def observe_received(self) -> None:
        """Count an inference request on arrival; it is in flight until its outcome."""
        self.received += 1
        self.in_flight += 1

    def observe_request(
        self,
        model: str | None,
        protocol: str,
        reason: str,
        seconds: float,
        *,
        outcome: str | None = None,
    ) -> None:
        """Count one inference request's outcome (``reason`` ``ok`` for a success).

        Args:
            model: the model it asked for (None when that was never known).
            protocol: ``openai`` or ``kserve``.
            reason: the response's reason (``ok``, or a key of the status table).
            seconds: its time, arrival to answer: a success's goes into the latency
                histogram, any other's is added up by outcome.
            outcome: overrides :data:`OUTCOME_OF_REASON` (``late`` for a deadline that
                passed during the forward pass).
        """
        if outcome is None:
            outcome = OUTCOME_OF_REASON.get(reason, "failed")
        key = (model or UNKNOWN_MODEL, outcome, reason)
        requests = self.requests
        requests[key] = requests.get(key, 0) + 1
        self.in_flight -= 1
        if outcome == "ok":
            series = self._latency.get((key[0], protocol))
            if series is None:
                series = self._latency[key[0], protocol] = _Histogram(_LATENCY_BUCKETS)
            series.observe(seconds)
        else:
            other = (key[0], outcome)
            self._other_s[other] = self._other_s.get(other, 0.0) + seconds

    def observe_batch(self, model: str, record: BatchRecord) -> None:
        """Record one finished forward pass (a batcher's ``on_batch``)."""
        if record.size == 0:
            return
        size, forward_s = record.size, record.forward_s
        self._batch_size[model].observe(size)
        self._forward[model].observe(forward_s)
        passes = self._passes[model]
        row = passes.by_size.get(size)
        if row is None:
            row = passes.by_size[size] = [0, 0.0]
        row[0] += 1
        row[1] += forward_s
        passes.item_forward_s += forward_s * size
        passes.last_unix = time.time()
        passes.forward.add(forward_s)
        wait = self._queue_wait[model]
        for w in record.queue_waits_s:
            wait.observe(w)
        passes.queue_wait.extend(record.queue_waits_s)

    # -- reading ---------------------------------------------------------------------------

    def models(self) -> list[str]:
        """The models whose state is reported, in order."""
        return list(self._sources)

    def account(self, model: str) -> Account:
        """A snapshot of ``model``'s accounting (see :class:`Account`).

        Raises:
            KeyError: ``model`` was never added.
        """
        passes = self._passes[model]
        sizes = self._batch_size[model]
        waits = self._queue_wait[model]
        return Account(
            requests={(o, r): n for (m, o, r), n in self.requests.items() if m == model},
            success_s=sum(h.total for (m, _), h in self._latency.items() if m == model),
            other_s={o: s for (m, o), s in self._other_s.items() if m == model},
            items=int(sizes.total),
            passes=sum(sizes.counts),
            queue_wait_s=waits.total,
            forward_s=self._forward[model].total,
            item_forward_s=passes.item_forward_s,
            by_size={n: (int(row[0]), row[1]) for n, row in sorted(passes.by_size.items())},
            last_pass_unix=passes.last_unix,
            recent_forward_s=passes.forward.latest(),
            recent_queue_wait_s=passes.queue_wait.latest(),
        )

    def stats(self, model: str) -> PolicyStats | None:
        """``model``'s batcher statistics now (None while it loads)."""
        return self._sources[model][0]()

    # -- scrape ----------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def describe(self) -> list[Metric]:
        """Nothing: the families are known only at scrape time (a custom collector)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every metric family, built from the counters and the models' statistics now."""
        received = CounterMetricFamily(
            "batchserve_requests_received",
            "Inference requests received, counted on arrival before anything is read.",
        )
        received.add_metric([], self.received)
        requests = CounterMetricFamily(
            "batchserve_requests",
            "Inference requests by outcome and reason.",
            labels=["model", "outcome", "reason"],
        )
        for key, value in sorted(self.requests.items()):
            requests.add_metric(list(key), value)
        in_flight = GaugeMetricFamily(
            "batchserve_requests_in_flight", "Inference requests received and not yet answered."
        )
        in_flight.add_metric([], self.in_flight)
        tasks = GaugeMetricFamily(
            "batchserve_event_loop_tasks",
            "asyncio tasks alive on the server's event loop (a leak shows as growth).",
        )
        tasks.add_metric([], _task_count())
        yield from (received, requests, in_flight, tasks)
        latency = HistogramMetricFamily(
            "batchserve_request_duration_seconds",
            "End-to-end latency of successful inference requests, arrival to response.",
            labels=["model", "protocol"],
        )
        for (model, protocol), series in sorted(self._latency.items()):
            series.add_to(latency, [model, protocol])
        yield latency
        for name, doc, table in (
            (
                "batchserve_queue_wait_seconds",
                "Seconds from admission to the start of the item's forward pass.",
                self._queue_wait,
            ),
            ("batchserve_batch_size", "Items per forward pass.", self._batch_size),
            ("batchserve_forward_seconds", "Duration of each forward pass.", self._forward),
        ):
            family = HistogramMetricFamily(name, doc, labels=["model"])
            for model, series in table.items():
                series.add_to(family, [model])
            yield family
        yield from self._state()

    def _state(self) -> Iterator[Metric]:
        items = CounterMetricFamily(
            "batchserve_items", "Items by batching-policy outcome.", labels=["model", "outcome"]
        )
        depth = GaugeMetricFamily("batchserve_queue_depth", "Items waiting now.", labels=["model"])
        running = GaugeMetricFamily(
            "batchserve_running_items",
            "Items dispatched to the model now: in forward passes, or prefetched to begin next.",
            labels=["model"],
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
        bisect_calls = CounterMetricFamily(
            "batchserve_bisect_calls",
            "Extra model calls spent isolating the inputs that made a batch raise.",
            labels=["model"],
        )
        ready = GaugeMetricFamily(
            "batchserve_model_ready", "1 when the model serves.", labels=["model"]
        )
        tokens = CounterMetricFamily(
            "batchserve_batch_tokens",
            "Tokens of the dispatched passes: padded (longest x count) and real.",
            labels=["model", "kind"],
        )
        waste = GaugeMetricFamily(
            "batchserve_padding_waste_ratio",
            "Padded tokens per real token of the dispatched passes (1: no padding).",
            labels=["model"],
        )
        per_token = GaugeMetricFamily(
            "batchserve_cost_per_token_seconds",
            "Fitted cost model: seconds per padded token.",
            labels=["model"],
        )
        capacity = GaugeMetricFamily(
            "batchserve_queue_capacity", "Items the queue holds at most.", labels=["model"]
        )
        max_batch = GaugeMetricFamily(
            "batchserve_max_batch_size", "Items a forward pass holds at most.", labels=["model"]
        )
        deadline = GaugeMetricFamily(
            "batchserve_default_deadline_seconds",
            "Deadline of a request that states none, seconds from its arrival.",
            labels=["model"],
        )
        for name, (config, timeout_s) in self._settings.items():
            if config is not None:
                capacity.add_metric([name], config.queue_size)
                max_batch.add_metric([name], config.max_batch_size)
            if timeout_s is not None:
                deadline.add_metric([name], timeout_s)
        yield from (capacity, max_batch, deadline)
        info = GaugeMetricFamily(
            "batchserve_model_info",
            "1 per served model, labelled with its kind (embedding, reranker, classifier, "
            "generic) once loaded, and what one of its items is (pair, text; item for a "
            "generic model): the unit of its item and batch size metrics.",
            labels=["model", "kind", "item"],
        )
        for name, kind_fn in self._kinds.items():
            kind = kind_fn()
            if kind is None:
                info.add_metric([name, "loading", "loading"], 1.0)
            else:
                info.add_metric([name, kind.name, item_of(kind) or "item"], 1.0)
        yield info
        for name, (stats_fn, ready_fn) in self._sources.items():
            ready.add_metric([name], 1.0 if ready_fn() else 0.0)
            stats = stats_fn()
            if stats is None:
                continue
            for outcome, value in _outcomes(stats.counters):
                items.add_metric([name, outcome], value)
            depth.add_metric([name], stats.queue_depth)
            running.add_metric([name], stats.running_items)
            fixed.add_metric([name], stats.cost.fixed_s)
            per_item.add_metric([name], stats.cost.per_item_s)
            samples.add_metric([name], stats.cost_samples)
            bisect_calls.add_metric([name], stats.bisect_calls)
            if stats.tokens is not None:
                tok = stats.tokens
                tokens.add_metric([name, "padded"], tok.padded)
                tokens.add_metric([name, "real"], tok.real)
                waste.add_metric([name], tok.waste)
                per_token.add_metric([name], tok.cost.per_token_s)
        yield from (items, depth, running, fixed, per_item, samples, ready, bisect_calls)
        yield from (tokens, waste, per_token)
        if self._class_sources:
            yield from self._classes()

    def _classes(self) -> Iterator[Metric]:
        items = CounterMetricFamily(
            "batchserve_class_items",
            "Items by class of work, tenant and batching-policy outcome.",
            labels=["model", "class", "tenant", "outcome"],
        )
        depth = GaugeMetricFamily(
            "batchserve_class_queue_depth",
            "Items waiting now, by class of work.",
            labels=["model", "class"],
        )
        for name, source in self._class_sources.items():
            got = source()
            if got is None:
                continue
            by_class, depths = got
            for work_class, tenants in by_class.items():
                for tenant, c in tenants.items():
                    for outcome, value in _outcomes(c):
                        items.add_metric([name, work_class, tenant, outcome], value)
            for work_class, n in depths.items():
                depth.add_metric([name, work_class], n)
        yield from (items, depth)


def _outcomes(c: Counters) -> Iterator[tuple[str, int]]:
    """The items' ``outcome`` label values and counts: one per end, one per refusal reason."""
    yield from (
        ("ok", c.ok),
        ("late", c.late),
        ("expired", c.expired),
        ("cancelled", c.cancelled),
        ("failed", c.failed),
    )
    for reason, value in c.rejected.items():
        yield f"rejected_{reason}", value
