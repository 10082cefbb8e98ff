"""Mixed traffic on virtual time: several streams of requests, each of its class and tenant.

Theory of operation
-------------------
:func:`simulate_mix` is the simulator's driver for mixed traffic. Each :class:`Stream` is an
open-loop schedule of requests of one class of work and tenant, each of ``inputs`` items.
With ``classes`` it runs the :class:`~batchserve.policy.Policy` with classes the server runs for
those classes; without, today's single FIFO :class:`~batchserve.policy.Policy`, with each
stream's deadline (the comparison the issue asks for). It hands the policy what the HTTP
server hands it for a request of several inputs:

* at the request's arrival, its items are offered one by one (``offer`` with its class
  and tenant); a refusal of any item refuses the request and withdraws the items already
  admitted, as :class:`~batchserve.server.exchange.Exchange` does;
* an item that expires in the queue, or whose deadline passes during its pass, times the
  request out there and then, and withdraws its other items;
* a request is ``ok`` when its last item finishes by its deadline, its latency is that
  finish minus its arrival.

It runs on the simulator's one event loop (:mod:`batchserve.sim.loop`); arrivals at one
instant are offered together, then the policy is polled once. Nothing reads the wall
clock: the same arguments give the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchserve.config import BatchConfig, CostEstimate, check_non_negative, check_positive
from batchserve.errors import ConfigError, Rejected
from batchserve.policy import Actions, Batch, ClassConfig, Entry, Policy
from batchserve.policy.entries import DONE
from batchserve.sim.loop import run_events
from batchserve.sim.workers import Workers
from batchserve.units import parse_duration
from batchserve.workload.arrivals import ARRIVAL_MODES, arrival_times
from batchserve.workload.summary import percentile

__all__ = ["MixResult", "Stream", "StreamFigures", "parse_stream", "simulate_mix"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stream:
    """One open-loop stream of requests.

    Attributes:
        work_class: the class of work its requests name.
        tenant: the tenant they belong to (None: none).
        rate: requests per second.
        inputs: items per request (texts in one embeddings request).
        timeout_s: each request's deadline from its arrival (None: its class's default).
        arrivals: ``constant`` or ``poisson``.
        seed: the seed of a poisson schedule.
    """

    work_class: str
    tenant: str | None = None
    rate: float
    inputs: int = 1
    timeout_s: float | None = None
    arrivals: str = "constant"
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive(f"stream {self.work_class} rate", self.rate)
        if isinstance(self.inputs, bool) or not isinstance(self.inputs, int) or self.inputs < 1:
            raise ConfigError(
                f"stream {self.work_class} inputs must be an integer >= 1, got {self.inputs!r}"
            )
        if self.timeout_s is not None:
            check_positive(f"stream {self.work_class} timeout", self.timeout_s)
        if self.arrivals not in ARRIVAL_MODES:
            raise ConfigError(
                f"stream {self.work_class} arrivals must be one of {', '.join(ARRIVAL_MODES)}, "
                f"got {self.arrivals!r}"
            )

    @property
    def label(self) -> str:
        """``class`` or ``class/tenant``."""
        return self.work_class if self.tenant is None else f"{self.work_class}/{self.tenant}"


_STREAM_KEYS = ("rate", "inputs", "timeout", "tenant", "arrivals", "seed")


def parse_stream(text: str) -> Stream:
    """A stream from ``CLASS:rate=R[,inputs=N,timeout=T,tenant=NAME,arrivals=A,seed=S]``.

    Raises:
        ConfigError: a missing rate, or a setting that is unknown or breaks its rule.
    """
    work_class, _, rest = text.strip().partition(":")
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in _STREAM_KEYS:
            raise ConfigError(
                f"stream {work_class!r}: each setting must be one of "
                f"{', '.join(k + '=...' for k in _STREAM_KEYS)}, got {part!r}"
            )
        fields[key.strip()] = value.strip()
    if "rate" not in fields:
        raise ConfigError(f"stream {work_class!r} needs rate=REQUESTS_PER_S")
    try:
        rate = float(fields["rate"])
        inputs = int(fields.get("inputs", "1"))
        seed = int(fields.get("seed", "0"))
    except ValueError as exc:
        raise ConfigError(
            f"stream {work_class!r}: rate, inputs and seed must be numbers ({exc})"
        ) from None
    timeout = fields.get("timeout")
    return Stream(
        work_class=work_class.strip(),
        tenant=fields.get("tenant") or None,
        rate=rate,
        inputs=inputs,
        timeout_s=None if timeout is None else parse_duration(timeout, name="stream timeout"),
        arrivals=fields.get("arrivals", "constant"),
        seed=seed,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamFigures:
    """What one stream's callers experienced. Rates count items (texts) per second.

    Attributes:
        stream: the stream.
        sent: requests scheduled.
        ok: requests answered in time.
        rejected: requests refused (any item refused), by reason.
        timed_out: requests that missed their deadline.
        offered_per_s: items scheduled per second.
        ok_per_s: items of ok requests per second of the run.
        p50_ms, p99_ms: latency of ok requests, arrival to last item's finish.
    """

    stream: Stream
    sent: int
    ok: int
    rejected: dict[str, int]
    timed_out: int
    offered_per_s: float
    ok_per_s: float
    p50_ms: float
    p99_ms: float

    @property
    def rejected_total(self) -> int:
        """Refused requests, whatever the reason."""
        return sum(self.rejected.values())

    def to_dict(self) -> dict[str, Any]:
        """The row's keys: ``class, tenant, offered_per_s, ok_per_s, p50_ms, p99_ms, ...``."""
        return {
            "class": self.stream.work_class,
            "tenant": self.stream.tenant or "",
            "offered_per_s": self.offered_per_s,
            "ok_per_s": self.ok_per_s,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "rejected": self.rejected_total,
            "timed_out": self.timed_out,
            "sent": self.sent,
            "ok": self.ok,
            "inputs": self.stream.inputs,
            "rejected_by_reason": dict(self.rejected),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class MixResult:
    """A mixed-traffic prediction.

    Attributes:
        policy: ``classes`` (the mixed policy) or ``fifo`` (one queue, as today).
        streams: each stream's figures, in the order given.
        batches: forward passes run.
        items: items run in them.
        end_s: virtual time of the last answer.
    """

    policy: str
    streams: tuple[StreamFigures, ...]
    batches: int
    items: int
    end_s: float = 0.0

    def to_dicts(self) -> list[dict[str, Any]]:
        """One object per stream, ``policy`` first."""
        return [{"policy": self.policy, **s.to_dict()} for s in self.streams]


class _Mix:
    """:func:`simulate_mix` as the event loop's driver: requests of several items."""

    def __init__(
        self,
        policy: Policy[int],
        streams: Sequence[Stream],
        deadlines: list[float | None],
        schedule: list[tuple[float, int]],
    ) -> None:
        self.policy = policy
        self.streams = streams
        self.deadlines = deadlines
        n = len(schedule)
        self.req_stream = [k for _, k in schedule]
        self.req_arrival = [t for t, _ in schedule]
        self.remaining = [streams[k].inputs for k in self.req_stream]
        self.done = [False] * n
        self.entries: list[list[Entry[int]]] = [[] for _ in range(n)]
        self.latencies: list[list[float]] = [[] for _ in streams]
        self.last_ok = [0.0] * len(streams)
        self.rejected: list[dict[str, int]] = [{} for _ in streams]
        self.timed_out = [0] * len(streams)
        self.end = 0.0

    def _withdraw(self, now: float, r: int) -> None:
        self.done[r] = True
        for e in self.entries[r]:
            if e.state != DONE:
                self.policy.cancel(now, e)

    def _time_out(self, now: float, r: int) -> None:
        if not self.done[r]:
            self.timed_out[self.req_stream[r]] += 1
            self.end = max(self.end, now)
            self._withdraw(now, r)

    def arrive(self, now: float, first: int, last: int) -> Sequence[int]:
        """Offer each request's items; a refusal of one refuses (and withdraws) them all."""
        policy = self.policy
        for i in range(first, last):
            k = self.req_stream[i]
            s = self.streams[k]
            d = self.deadlines[k]
            deadline = None if d is None else now + d
            try:
                for _ in range(s.inputs):
                    entry = policy.offer(now, i, deadline, work_class=s.work_class, tenant=s.tenant)
                    self.entries[i].append(entry)
            except Rejected as exc:
                self.rejected[k][exc.reason] = self.rejected[k].get(exc.reason, 0) + 1
                self._withdraw(now, i)
        return _ONE

    def polled(self, replica: int, now: float, actions: Actions[int]) -> None:
        """An item late or expired times its request out now."""
        for e in actions.late:
            self._time_out(now, e.payload)
        for e in actions.expired:
            self._time_out(now, e.payload)

    def finished(
        self, replica: int, now: float, batch: Batch[int], skipped: list[Entry[int]]
    ) -> None:
        """A request is ``ok`` when its last item finishes by its deadline."""
        done = self.done
        remaining = self.remaining
        for e in batch.entries:
            r = e.payload
            if done[r] or e.withdrawn:
                continue
            if e.deadline is not None and now > e.deadline:
                self._time_out(now, r)
                continue
            remaining[r] -= 1
            if not remaining[r]:
                done[r] = True
                k = self.req_stream[r]
                self.latencies[k].append(now - self.req_arrival[r])
                self.last_ok[k] = self.end = now

    def released(self, replica: int, now: float) -> None:
        """Not asked for."""


_ONE = (0,)


def simulate_mix(
    *,
    config: BatchConfig,
    cost: CostEstimate,
    streams: Sequence[Stream],
    duration_s: float,
    classes: ClassConfig | None = None,
    timeout_s: float | None = None,
    overhead_s: float = 0.0,
) -> MixResult:
    """Run mixed traffic against the policy on virtual time.

    Args:
        config: the batcher's settings, as the server takes them.
        cost: the true cost of a pass, ``fixed_s + n * per_item_s``.
        streams: the traffic, one stream per class and tenant.
        duration_s: the schedules' length.
        classes: the classes of work (the mixed policy); None: one FIFO queue, as today.
        timeout_s: the deadline of a stream that states none and whose class has none.
        overhead_s: seconds the driver adds to every pass.

    Raises:
        ConfigError: a stream names a class that ``classes`` does not have, or a bad value.
    """
    check_positive("duration_s", duration_s)
    check_non_negative("overhead_s", overhead_s)
    policy: Policy[int] = Policy(config, classes=classes)
    deadlines: list[float | None] = []
    for s in streams:
        t = s.timeout_s
        if classes is not None:
            if s.work_class not in classes.names:
                raise ConfigError(
                    f"stream {s.label}: class must be one of {', '.join(classes.names)}, "
                    f"got {s.work_class!r}"
                )
            if t is None:
                t = classes.resolve(s.work_class).timeout_s
        deadlines.append(t if t is not None else timeout_s)

    schedule = sorted(
        (t, k)
        for k, s in enumerate(streams)
        for t in arrival_times(rate=s.rate, duration_s=duration_s, arrivals=s.arrivals, seed=s.seed)
    )
    fixed = cost.fixed_s + overhead_s
    per_item = cost.per_item_s
    workers = Workers[int](config.workers, lambda live: fixed + len(live) * per_item)
    mix = _Mix(policy, streams, deadlines, schedule)
    run_events(mix.req_arrival, [policy], [workers], mix)
    latencies, last_ok, rejected, timed_out = (
        mix.latencies,
        mix.last_ok,
        mix.rejected,
        mix.timed_out,
    )
    req_stream, end = mix.req_stream, mix.end

    figures = []
    for k, s in enumerate(streams):
        lat = sorted(latencies[k])
        sent = sum(1 for x in req_stream if x == k)
        figures.append(
            StreamFigures(
                stream=s,
                sent=sent,
                ok=len(lat),
                rejected=rejected[k],
                timed_out=timed_out[k],
                offered_per_s=sent * s.inputs / duration_s,
                # Over the schedule, or until the stream's last answer if that came later.
                ok_per_s=len(lat) * s.inputs / max(duration_s, last_ok[k]),
                p50_ms=percentile(lat, 0.50) * 1e3,
                p99_ms=percentile(lat, 0.99) * 1e3,
            )
        )
    return MixResult(
        policy=policy.discipline,
        streams=tuple(figures),
        batches=workers.passes,
        items=workers.items,
        end_s=end,
    )
