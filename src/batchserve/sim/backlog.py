"""The deterministic seed's experiment: a backlog served unbatched, then batched.

``N`` requests are all waiting at time 0 and nothing more will arrive. The batching policy,
driven by the simulator, serves them in passes of at most ``B`` (the queue drains without
waiting for ``max_wait_s``, since nothing more will come), each pass costing
``fixed_s + n * per_item_s``. The same backlog is served once with ``B = 1`` and once with
the given ``B``; batching shares the fixed cost of a pass across the batch, so the batched
run clears the same work in fewer passes. :meth:`BacklogResult.format` prints it in the
seed's words and figures, and :attr:`BacklogResult.ok` is the seed's verdict: a gain above
:data:`REQUIRED_GAIN`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import ConfigError
from batchserve.sim.engine import simulate

__all__ = ["REQUIRED_GAIN", "BacklogResult", "BacklogRun", "simulate_backlog"]

#: The seed's bar: batching must raise throughput by more than this factor.
REQUIRED_GAIN = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BacklogRun:
    """One way of serving the backlog.

    Attributes:
        max_batch_size: at most this many requests per pass.
        passes: forward passes run.
        total_s: virtual time until the last request finished.
        throughput_per_s: requests per second over ``total_s``.
    """

    max_batch_size: int
    passes: int
    total_s: float
    throughput_per_s: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "max_batch_size": self.max_batch_size,
            "passes": self.passes,
            "total_s": self.total_s,
            "throughput_per_s": self.throughput_per_s,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class BacklogResult:
    """The backlog served unbatched and batched.

    Attributes:
        requests: the backlog's size.
        cost: the cost of a pass.
        unbatched: served one request per pass.
        batched: served in passes of at most the given batch size.
    """

    requests: int
    cost: CostEstimate
    unbatched: BacklogRun
    batched: BacklogRun

    @property
    def gain(self) -> float:
        """Batched throughput over unbatched throughput."""
        return self.batched.throughput_per_s / self.unbatched.throughput_per_s

    @property
    def ok(self) -> bool:
        """The seed's verdict: the same work was done, with a gain above ``REQUIRED_GAIN``."""
        return self.gain > REQUIRED_GAIN

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the two runs, the gain and the verdict."""
        return {
            "mode": "backlog",
            "requests": self.requests,
            "fixed_s": self.cost.fixed_s,
            "per_item_s": self.cost.per_item_s,
            "unbatched": self.unbatched.to_dict(),
            "batched": self.batched.to_dict(),
            "gain": self.gain,
            "required_gain": REQUIRED_GAIN,
            "ok": self.ok,
        }

    def format(self) -> str:
        """The seed's report, line for line (without a trailing newline)."""
        n, u, b = self.requests, self.unbatched, self.batched
        lines = [
            f"STEP 1: serve {n} requests UNBATCHED (one per forward pass)",
            f"  forward passes : {u.passes}",
            f"  total time     : {u.total_s * 1000.0:.0f} ms",
            f"  throughput     : {u.throughput_per_s:.1f} req/s",
            "",
            f"STEP 2: serve the same {n} requests BATCHED (up to {b.max_batch_size} per pass)",
            f"  forward passes : {b.passes}",
            f"  total time     : {b.total_s * 1000.0:.0f} ms",
            f"  throughput     : {b.throughput_per_s:.1f} req/s",
            "",
            "STEP 3: batching shares the fixed per-pass overhead across the batch",
            f"  throughput gain: {self.gain:.1f}x",
            "",
            "BATCHING RAISED THROUGHPUT (same work, fewer passes): " + ("YES" if self.ok else "NO"),
        ]
        if self.ok:
            lines.append(
                "Batching is the first serving lever. Next: quantization to cut the cost per pass."
            )
        return "\n".join(lines)


def _serve(
    requests: int, max_batch_size: int, cost: CostEstimate, workers: int, overhead_s: float
) -> BacklogRun:
    config = BatchConfig(
        max_batch_size=max_batch_size,
        max_wait_s=0.0,
        queue_size=requests,
        workers=workers,
        admission=False,
    )
    result = simulate(
        config=config, cost=cost, arrivals=[0.0] * requests, drain=True, overhead_s=overhead_s
    )
    total_s = result.end_s
    return BacklogRun(
        max_batch_size=max_batch_size,
        passes=result.batches,
        total_s=total_s,
        throughput_per_s=requests / total_s if total_s > 0 else float("inf"),
    )


def simulate_backlog(
    *,
    requests: int,
    max_batch_size: int,
    cost: CostEstimate,
    workers: int = 1,
    overhead_s: float = 0.0,
) -> BacklogResult:
    """Serve ``requests`` waiting at time 0, unbatched and then in passes of at most ``B``.

    Args:
        requests: the backlog's size (>= 1).
        max_batch_size: the batched run's ``B`` (>= 1).
        cost: the cost of a pass; its fixed cost must be > 0 (else throughput is unbounded).
        workers: passes that may run at once.
        overhead_s: seconds added to every pass (see :func:`~batchserve.sim.simulate`).

    Raises:
        ConfigError: a size is < 1 or the cost of a pass is zero.
    """
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise ConfigError(f"requests must be an integer >= 1, got {requests!r}")
    if cost.fixed_s <= 0 and cost.per_item_s <= 0:
        raise ConfigError(f"the cost of a pass must be > 0, got {cost!r}")
    return BacklogResult(
        requests=requests,
        cost=cost,
        unbatched=_serve(requests, 1, cost, workers, overhead_s),
        batched=_serve(requests, max_batch_size, cost, workers, overhead_s),
    )
