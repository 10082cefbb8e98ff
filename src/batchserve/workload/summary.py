"""What callers experienced in a run, summarized as the seed prints it.

Shared by ``batchserve demo`` (in-process), ``batchserve load`` (over HTTP) and
``batchserve simulate`` (virtual time), so that the three can be laid side by side: the same
keys, the same percentile rule, the same printed columns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from batchserve.units import format_duration

__all__ = ["DEMO_KEYS", "LoadSummary", "batch_label", "percentile", "summarize"]

#: The keys ``batchserve demo --json`` and ``batchserve load --json`` print first, in order.
DEMO_KEYS = (
    "name",
    "max_batch_size",
    "max_wait_s",
    "offered_per_s",
    "ok_per_s",
    "avg_batch",
    "p50_ms",
    "p99_ms",
    "rejected",
    "timed_out",
)


def batch_label(max_batch_size: int, max_wait_s: float, workers: int = 1) -> str:
    """A row's label from its batching settings: ``batch<=32, wait 2ms[, 2 workers]``."""
    name = f"batch<={max_batch_size}, wait {format_duration(max_wait_s)}"
    return name if workers == 1 else f"{name}, {workers} workers"


def percentile(sorted_values: list[float], q: float) -> float:
    """The seed's percentile: ``values[int(q * (n - 1))]`` of sorted values (0.0 if empty)."""
    if not sorted_values:
        return 0.0
    return sorted_values[int(q * (len(sorted_values) - 1))]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSummary:
    """One run's figures. Latencies in milliseconds, rates per second.

    Attributes:
        name: the row's label.
        max_batch_size: the batcher's max batch size (0 if unknown).
        max_wait_s: the batcher's max wait (-1 if unknown).
        offered_per_s: requests scheduled per second.
        ok_per_s: successful requests per second of the run.
        avg_batch: items per forward pass.
        p50_ms, p90_ms, p99_ms, max_ms: latency of successful requests, from scheduled send.
        sent: requests scheduled.
        ok: successful requests.
        rejected: refused requests (all reasons).
        rejected_by_reason: refused requests by reason.
        timed_out: requests that missed their deadline (expired, late, or client timeout).
        errors: anything else that failed.
        duration_s: the run's length.
    """

    name: str
    max_batch_size: int = 0
    max_wait_s: float = -1.0
    offered_per_s: float
    ok_per_s: float
    avg_batch: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    sent: int
    ok: int
    rejected: int
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    timed_out: int
    errors: int
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: :data:`DEMO_KEYS` first, in their order, then the rest."""
        full = asdict(self)
        out = {k: full[k] for k in DEMO_KEYS}
        out.update({k: v for k, v in full.items() if k not in out})
        return out

    def format_row(self) -> str:
        """One line in the Go seed's columns."""
        return (
            f"{self.name:<26} {self.ok_per_s:5.0f} ok/s  batch {self.avg_batch:4.1f}  "
            f"p50 {self.p50_ms:5.1f} ms  p99 {self.p99_ms:6.1f} ms  "
            f"rejected {self.rejected:4d}  timed out {self.timed_out:4d}"
        )


def summarize(
    *,
    name: str,
    latencies_s: Iterable[float],
    sent: int,
    duration_s: float,
    offered_per_s: float,
    rejected_by_reason: dict[str, int],
    timed_out: int,
    errors: int,
    items: int,
    batches: int,
    max_batch_size: int = 0,
    max_wait_s: float = -1.0,
) -> LoadSummary:
    """Build a :class:`LoadSummary` from raw figures (latencies of successes, in seconds)."""
    lat = sorted(latencies_s)
    ms = [v * 1e3 for v in lat]

    def r(v: float) -> float:
        return round(v, 3) if math.isfinite(v) else v

    return LoadSummary(
        name=name,
        max_batch_size=max_batch_size,
        max_wait_s=max_wait_s,
        offered_per_s=r(offered_per_s),
        ok_per_s=r(len(lat) / duration_s if duration_s > 0 else 0.0),
        avg_batch=r(items / batches if batches else 0.0),
        p50_ms=r(percentile(ms, 0.5)),
        p90_ms=r(percentile(ms, 0.9)),
        p99_ms=r(percentile(ms, 0.99)),
        max_ms=r(ms[-1] if ms else 0.0),
        sent=sent,
        ok=len(lat),
        rejected=sum(rejected_by_reason.values()),
        rejected_by_reason=dict(rejected_by_reason),
        timed_out=timed_out,
        errors=errors,
        duration_s=r(duration_s),
    )
