"""Outcome counters and the frozen statistics snapshot of a policy.

Every item the policy receives ends in exactly one outcome: ``ok`` (finished by its deadline
or had none), ``late`` (finished after its deadline), ``rejected`` (refused at admission, by
reason), ``expired`` (its deadline passed while queued), ``cancelled`` (its caller left before
the forward pass) or ``failed`` (the model raised for it). While items are queued or running
they are counted as ``pending``, so ``received == ok + late + rejected + expired + cancelled +
failed + pending`` holds at every instant.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from batchserve.config import CostEstimate
from batchserve.policy.entries import DONE, Entry
from batchserve.subpasses import PassCost

__all__ = ["REJECT_REASONS", "Counters", "PolicyStats", "Tally", "TokenStats", "tally_pass"]

#: The machine-readable reasons a policy refuses an item, in a stable order.
REJECT_REASONS = ("queue_full", "infeasible", "draining")


def tally_pass(
    now: float,
    entries: list[Entry[Any]],
    failed: Collection[Entry[Any]],
    skipped: Collection[Entry[Any]],
) -> tuple[int, int, int, int]:
    """The outcomes of a pass that ended at ``now``: ``(ok, late, failed, cancelled)``.

    Each entry not yet done is marked done and counted once: ``cancelled`` if ``skipped``
    (not run: its caller had left), ``failed`` if in ``failed``, else ``late`` or ``ok`` by
    its deadline. An entry already done (it expired while its batch was prefetched) has its
    outcome and is not counted again.
    """
    ok = late = 0
    if not failed and not skipped:
        for e in entries:
            if e.state == DONE:
                continue
            e.state = DONE
            if e.deadline is not None and now > e.deadline:
                late += 1
            else:
                ok += 1
        return ok, late, 0, 0
    failed_ids = {e.id for e in failed}
    skipped_ids = {e.id for e in skipped}
    n_failed = cancelled = 0
    for e in entries:
        if e.state == DONE:
            continue
        e.state = DONE
        if e.id in skipped_ids:
            cancelled += 1
        elif e.id in failed_ids:
            n_failed += 1
        elif e.deadline is not None and now > e.deadline:
            late += 1
        else:
            ok += 1
    return ok, late, n_failed, cancelled


@dataclass(frozen=True, slots=True, kw_only=True)
class Counters:
    """How many items ended in each outcome.

    Attributes:
        received: items offered to the policy, admitted or not.
        ok: finished by their deadline (or had none).
        late: finished after their deadline.
        rejected: refused at admission, by reason (``queue_full``, ``infeasible``, ``draining``).
        expired: deadline passed while queued.
        cancelled: the caller left before the forward pass.
        failed: the model raised for the item.
        pending: queued or running now.
    """

    received: int = 0
    ok: int = 0
    late: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    expired: int = 0
    cancelled: int = 0
    failed: int = 0
    pending: int = 0

    @property
    def rejected_total(self) -> int:
        """All refusals, whatever the reason."""
        return sum(self.rejected.values())

    @property
    def resolved(self) -> int:
        """Items that reached an outcome (everything but ``pending``)."""
        return (
            self.ok + self.late + self.rejected_total + self.expired + self.cancelled + self.failed
        )


class Tally:
    """Mutable outcome counters: a policy's, or one class and tenant label's.

    :meth:`snapshot` is the frozen :class:`Counters`.
    """

    __slots__ = ("cancelled", "expired", "failed", "late", "ok", "pending", "received", "rejected")

    def __init__(self) -> None:
        self.received = 0
        self.ok = 0
        self.late = 0
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.expired = 0
        self.cancelled = 0
        self.failed = 0
        self.pending = 0

    def snapshot(self) -> Counters:
        """A frozen copy."""
        return Counters(
            received=self.received,
            ok=self.ok,
            late=self.late,
            rejected=dict(self.rejected),
            expired=self.expired,
            cancelled=self.cancelled,
            failed=self.failed,
            pending=self.pending,
        )

    def refuse(self, reason: str) -> None:
        """Count one item received and refused for ``reason``."""
        self.received += 1
        self.rejected[reason] += 1

    def add_pass(self, ok: int, late: int, failed: int, cancelled: int) -> None:
        """Count the outcomes of a pass's items (:func:`tally_pass`); they are no longer pending."""
        self.ok += ok
        self.late += late
        self.failed += failed
        self.cancelled += cancelled
        self.pending -= ok + late + failed + cancelled


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenStats:
    """The tokens of a policy that forms batches by tokens.

    Attributes:
        padded: tokens the dispatched passes computed, padding included: each pass's
            length-sorted sub-passes as the policy planned them, each padded to its longest.
        real: the dispatched items' own tokens.
        queued: tokens of the items waiting now.
        cost: the fitted cost of one sub-pass (fixed, per padded token, attention).
        cost_samples: passes the token cost model has been fitted on.
    """

    padded: int
    real: int
    queued: int
    cost: PassCost
    cost_samples: int

    @property
    def waste(self) -> float:
        """Padded tokens per real token (1.0: no padding; 0.0 before the first pass)."""
        return self.padded / self.real if self.real else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyStats:
    """A frozen snapshot of a policy's state.

    Attributes:
        counters: outcome counters.
        queue_depth: items waiting now.
        running_items: items dispatched now: in forward passes, or prefetched to begin next.
        running_batches: batches dispatched now (passes under way, and prefetched ones).
        batches: forward passes finished.
        batch_sizes: finished passes by batch size (size -> count).
        bisect_calls: extra model calls spent isolating failing inputs.
        cost: the fitted cost model.
        cost_samples: passes the cost model has been fitted on.
        draining: whether new items are refused because the policy is closing.
        tokens: the tokens' figures of a policy that forms batches by tokens (else None).
    """

    counters: Counters
    queue_depth: int
    running_items: int
    running_batches: int
    batches: int
    batch_sizes: dict[int, int]
    bisect_calls: int
    cost: CostEstimate
    cost_samples: int
    draining: bool
    tokens: TokenStats | None = None

    @property
    def avg_batch(self) -> float:
        """Mean items per finished forward pass (0.0 before the first)."""
        items = sum(size * count for size, count in self.batch_sizes.items())
        return items / self.batches if self.batches else 0.0
