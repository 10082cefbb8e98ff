"""A fleet on virtual time: N replicas of the same policy behind a load balancer.

Theory of operation
-------------------
:func:`simulate_fleet` is :func:`~batchserve.sim.engine.simulate` for several replicas. Each
replica is a :class:`~batchserve.policy.Policy` of its own, built from the same
:class:`~batchserve.config.BatchConfig`, with its own workers and its own timer; the simulator's one
event loop (:mod:`batchserve.sim.loop`) holds every replica's events, so the whole fleet runs
on one virtual clock. Nothing reads the wall clock, and the only randomness (``power_of_two``)
comes from a generator seeded by the caller: the same arguments give the same result.

A router stands where nginx stands in ``deploy/nginx/``. It sees what a load balancer sees:
each replica's *outstanding* requests (routed to it and not yet answered, as nginx counts
active connections), nothing of their cost. On each arrival it picks a replica:

* ``round_robin``: the next replica in turn;
* ``least_conn``: the fewest outstanding, ties broken in turn (nginx ``least_conn``);
* ``power_of_two``: two replicas drawn at random, the one with fewer outstanding (nginx
  ``random two least_conn``).

A replica that refuses (queue full, infeasible deadline) did no work, so the router tries
another one it has not tried for this request, by the same rule, up to ``max_tries``
attempts in all (nginx ``proxy_next_upstream http_429 ... non_idempotent`` with
``proxy_next_upstream_tries``). A request is refused to its client only when every attempt
is refused; retrying takes no virtual time, as a refusal over a local network takes well
under a millisecond.

A request is outstanding at a replica from its admission until its answer: at the end of
its pass (``ok``), at its deadline when that passes in the queue (``expired``) or during the
pass (``late``: the caller is answered at the deadline, while the pass runs on; a release
event at the deadline ends it). Latency is counted from the arrival at the balancer, which
is the arrival at the replica.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchserve.config import BatchConfig, CostEstimate, check_non_negative, check_positive
from batchserve.errors import ConfigError, Rejected
from batchserve.policy import REJECT_REASONS, Actions, Batch, Entry, Policy
from batchserve.sim.loop import check_sorted, run_events
from batchserve.sim.workers import Workers
from batchserve.workload.summary import LoadSummary, summarize

__all__ = ["ROUTINGS", "FleetResult", "ReplicaFigures", "simulate_fleet"]

#: The routing rules, as ``--routing`` takes them.
ROUTINGS = ("round_robin", "least_conn", "power_of_two")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaFigures:
    """What one replica of the fleet did.

    Attributes:
        attempts: requests routed to it, refused ones included.
        ok: items finished by their deadline.
        rejected: attempts it refused (the router may have retried them elsewhere).
        late: items whose pass ended after their deadline.
        expired: items whose deadline passed in its queue.
        batches: forward passes it ran.
        items: items in those passes.
    """

    attempts: int
    ok: int
    rejected: int
    late: int
    expired: int
    batches: int
    items: int

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready dict."""
        return {
            "attempts": self.attempts,
            "ok": self.ok,
            "rejected": self.rejected,
            "late": self.late,
            "expired": self.expired,
            "batches": self.batches,
            "items": self.items,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetResult:
    """What a fleet simulation predicts.

    Attributes:
        summary: the fleet as its clients see it (a request is ``rejected`` only when every
            replica tried refused it), in the load generator's keys.
        replicas: how many replicas.
        routing: the routing rule.
        retries: attempts beyond each request's first (refusals retried elsewhere).
        late: items whose pass finished after their deadline (part of ``timed_out``).
        expired: items whose deadline passed in a queue (part of ``timed_out``).
        batches: forward passes run by the whole fleet.
        end_s: virtual time of the last answer.
        per_replica: each replica's figures, in replica order.
    """

    summary: LoadSummary
    replicas: int
    routing: str
    retries: int
    late: int
    expired: int
    batches: int
    end_s: float
    per_replica: tuple[ReplicaFigures, ...]

    def to_dict(self) -> dict[str, Any]:
        """The summary's keys, then the fleet's own."""
        out = self.summary.to_dict()
        out.update(
            replicas=self.replicas,
            routing=self.routing,
            retries=self.retries,
            expired=self.expired,
            late=self.late,
            batches=self.batches,
            end_s=self.end_s,
            per_replica=[r.to_dict() for r in self.per_replica],
        )
        return out


class _Router:
    """Picks a replica for an attempt, from the outstanding counts (see the module doc)."""

    def __init__(self, routing: str, outstanding: list[int], seed: int) -> None:
        self.routing = routing
        self.outstanding = outstanding
        self.n = len(outstanding)
        self.turn = 0
        self.rng = random.Random(seed)

    def pick(self, tried: Sequence[int]) -> int:
        """The replica for the next attempt, one not in ``tried`` (fewer than ``n``)."""
        n, out = self.n, self.outstanding
        if self.routing == "power_of_two":
            pool: Sequence[int] = range(n) if not tried else [r for r in range(n) if r not in tried]
            if len(pool) == 1:
                return pool[0]
            a, b = self.rng.sample(pool, 2)
            return b if out[b] < out[a] else a
        start = self.turn
        if self.routing == "round_robin":
            for k in range(n):
                r = (start + k) % n
                if r not in tried:
                    self.turn = r + 1
                    return r
        best, low = -1, math.inf
        for k in range(n):
            r = (start + k) % n
            if out[r] < low and r not in tried:
                best, low = r, out[r]
        self.turn = best + 1
        return best


class _Fleet:
    """:func:`simulate_fleet` as the event loop's driver: a router before the replicas."""

    def __init__(
        self,
        policies: list[Policy[int]],
        router: _Router,
        outstanding: list[int],
        tries: int,
        timeout_s: float | None,
    ) -> None:
        replicas = len(policies)
        self.policies = policies
        self.router = router
        self.outstanding = outstanding
        self.tries = tries
        self.timeout_s = timeout_s
        self.attempts = [0] * replicas
        self.oks = [0] * replicas
        self.refused = [0] * replicas
        self.lates = [0] * replicas
        self.expireds = [0] * replicas
        self.latencies: list[float] = []
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.retries = 0
        self.end = 0.0

    def arrive(self, now: float, first: int, last: int) -> Sequence[int]:
        """Route each arrival, retrying refusals elsewhere; poll each replica that admitted."""
        timeout_s = self.timeout_s
        deadline = None if timeout_s is None else now + timeout_s
        touched: list[int] = []
        for i in range(first, last):
            tried: list[int] = []
            reason = ""
            while len(tried) < self.tries:
                r = self.router.pick(tried)
                tried.append(r)
                self.attempts[r] += 1
                try:
                    self.policies[r].offer(now, i, deadline)
                except Rejected as exc:
                    self.refused[r] += 1
                    reason = exc.reason
                    continue
                self.outstanding[r] += 1
                if r not in touched:
                    touched.append(r)
                reason = ""
                break
            self.retries += len(tried) - 1
            if reason:
                self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return touched

    def polled(self, replica: int, now: float, actions: Actions[int]) -> None:
        """Items expired in the queue are answered now."""
        if actions.expired:
            k = len(actions.expired)
            self.expireds[replica] += k
            self.outstanding[replica] -= k
            self.end = now

    def finished(
        self, replica: int, now: float, batch: Batch[int], skipped: list[Entry[int]]
    ) -> None:
        """Each item is ``ok`` by its deadline (and leaves the replica), else ``late``."""
        append = self.latencies.append
        for e in batch.entries:
            d = e.deadline
            if d is None or now <= d:
                append(now - e.arrival)
                self.oks[replica] += 1
                self.outstanding[replica] -= 1
                self.end = now
            else:
                self.lates[replica] += 1

    def released(self, replica: int, now: float) -> None:
        """A late item's caller is answered at its deadline: it leaves the replica."""
        self.outstanding[replica] -= 1
        self.end = max(self.end, now)


def simulate_fleet(
    *,
    replicas: int,
    routing: str,
    config: BatchConfig,
    cost: CostEstimate,
    arrivals: Sequence[float],
    timeout_s: float | None = None,
    duration_s: float | None = None,
    overhead_s: float = 0.0,
    max_tries: int | None = None,
    seed: int = 0,
    name: str = "fleet",
) -> FleetResult:
    """Run ``replicas`` copies of the batching policy behind a router on virtual time.

    Args:
        replicas: how many replicas, >= 1.
        routing: one of :data:`ROUTINGS`.
        config: each replica's batcher settings, as ``serve`` takes them.
        cost: the true cost of a forward pass, ``fixed_s + n * per_item_s`` seconds.
        arrivals: arrival times at the balancer in seconds, sorted, >= 0.
        timeout_s: each request's deadline, from its arrival; None for no deadline.
        duration_s: the schedule's length (for the offered rate, and the least time
            ``ok_per_s`` is counted over); None: the last arrival's time.
        overhead_s: seconds each replica adds to every pass, on top of ``cost``.
        max_tries: attempts per request at most (a refusal is retried on another replica);
            None: every replica may be tried once.
        seed: the seed of ``power_of_two``'s draws.
        name: the summary's label.

    Returns:
        The prediction. It depends only on the arguments.

    Raises:
        ConfigError: ``replicas`` or ``max_tries`` is not >= 1, ``routing`` is unknown,
            ``timeout_s`` is not > 0, or ``duration_s`` or ``overhead_s`` is negative.
        ValueError: the arrivals are not sorted or one is negative.
    """
    if replicas < 1:
        raise ConfigError(f"replicas must be >= 1, got {replicas}")
    if routing not in ROUTINGS:
        raise ConfigError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if max_tries is not None and max_tries < 1:
        raise ConfigError(f"max_tries must be >= 1, got {max_tries}")
    if timeout_s is not None:
        check_positive("timeout_s", timeout_s)
    if duration_s is not None:
        check_non_negative("duration_s", duration_s)
    check_non_negative("overhead_s", overhead_s)
    check_sorted(arrivals)
    n = len(arrivals)
    if duration_s is None:
        duration_s = arrivals[-1] if n else 0.0
    tries = replicas if max_tries is None else min(max_tries, replicas)

    policies: list[Policy[int]] = [Policy(config) for _ in range(replicas)]

    def took(live: list[Entry[int]]) -> float:
        return fixed + len(live) * per_item

    workers = [Workers[int](config.workers, took) for _ in range(replicas)]
    outstanding = [0] * replicas
    router = _Router(routing, outstanding, seed)
    fixed = cost.fixed_s + overhead_s
    per_item = cost.per_item_s
    fleet = _Fleet(policies, router, outstanding, tries, timeout_s)
    run_events(arrivals, policies, workers, fleet, release_late=True)
    attempts, oks, refused, lates, expireds = (
        fleet.attempts,
        fleet.oks,
        fleet.refused,
        fleet.lates,
        fleet.expireds,
    )
    latencies, rejected, retries, end = fleet.latencies, fleet.rejected, fleet.retries, fleet.end

    late, expired = sum(lates), sum(expireds)
    batch_counts = [w.passes for w in workers]
    item_counts = [w.items for w in workers]
    batches, items = sum(batch_counts), sum(item_counts)
    summary = summarize(
        name=name,
        latencies_s=latencies,
        sent=n,
        duration_s=max(end, duration_s),
        offered_per_s=n / duration_s if duration_s > 0 else 0.0,
        rejected_by_reason={k: v for k, v in rejected.items() if v},
        timed_out=late + expired,
        errors=0,
        items=items,
        batches=batches,
        max_batch_size=config.max_batch_size,
        max_wait_s=config.max_wait_s,
    )
    per_replica = tuple(
        ReplicaFigures(
            attempts=attempts[r],
            ok=oks[r],
            rejected=refused[r],
            late=lates[r],
            expired=expireds[r],
            batches=batch_counts[r],
            items=item_counts[r],
        )
        for r in range(replicas)
    )
    return FleetResult(
        summary=summary,
        replicas=replicas,
        routing=routing,
        retries=retries,
        late=late,
        expired=expired,
        batches=batches,
        end_s=end,
        per_replica=per_replica,
    )
