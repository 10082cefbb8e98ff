"""The discrete-event simulator: the server's batching policy, driven on virtual time.

Theory of operation
-------------------
The simulator is the policy's second driver; the first is the asyncio
:class:`~batchserve.batcher.Batcher`. It owns one :class:`~batchserve.policy.Policy`, built
from the same :class:`~batchserve.config.BatchConfig` the server takes, and hands it the
same events the Batcher does, at virtual times:

* an **arrival** at its scheduled time: ``offer(now, i, now + timeout_s)``. A refusal is
  counted by reason and nothing else happens, as in ``Batcher.submit_nowait``;
* a **timer** at the ``wake_at`` the policy asked for last (one timer, re-armed when
  ``wake_at`` changes, stale ones ignored);
* a **finished pass** at ``batch.start + fixed_s + n * per_item_s + tokens_s + overhead_s``:
  ``finish(now, batch)``. ``tokens_s`` is what the pass's tokens cost, when ``sizes`` are
  given. With ``subpass`` (a :class:`~batchserve.subpasses.PassCost`), the pass runs as the
  engines run it: its items sorted by length and cut into sub-passes by
  :func:`~batchserve.subpasses.plan` with that (true) cost, and ``tokens_s`` is the
  sub-passes' predicted seconds (:func:`~batchserve.subpasses.predict_s`): a fixed cost per
  sub-pass, every padded token, the attention term. With ``per_token_s`` instead, the pass
  is one padded pass (a model that pads every item to the pass's longest ``L``):
  ``tokens_s = per_token_s * n * L``. The policy's own cost models learn
  ``now - batch.start``, which here is exactly that. ``overhead_s`` (0 by default: a server
  with no overhead of its own) stands for what a real driver adds to each pass: handing the
  batch to a worker thread and the answer back to the event loop, the timer slack of the
  model's own waits.

With ``sizes`` (each request's tokens) the policy is the server's for a model that counts
tokens (:func:`~batchserve.policy.make_policy`: by tokens unless ``batch_by`` is ``count``),
and every arrival is offered with its size, as the Batcher does.

After each event it calls ``poll(now)`` and carries the answer out at once: expired items
are answered at ``now``, each dispatched batch gets its finish event, the timer is re-armed.
Arrivals at the same instant arrive together: all are offered, then the policy is polled
once, so a backlog present at time 0 is queued whole before the first batch is formed.

Events wait in a heap keyed ``(time, seq)``, ``seq`` growing with every push, so ties break
in the order events were scheduled. The arrival schedule is known in advance and is merged
in from its sorted list, as if it had been pushed first: at equal times an arrival comes
before a timer or a finish. Nothing reads the wall clock or the global random state, so the
same inputs give the same result, bit for bit.

Outcomes follow the Batcher: an item finished by its deadline is ``ok`` with latency
``finish - arrival``; one whose pass ends after its deadline is ``late`` (its caller was
answered ``DeadlineExceeded`` at the deadline); one whose deadline passes in the queue is
``expired``. Late and expired items are both reported as ``timed_out``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, NamedTuple

from batchserve.config import BatchConfig, CostEstimate, check_non_negative, check_positive
from batchserve.errors import ConfigError, Rejected
from batchserve.policy import REJECT_REASONS, Batch, Entry, Policy, PolicyStats, make_policy
from batchserve.sim.workers import Workers
from batchserve.subpasses import PassCost, plan, predict_s, shape
from batchserve.workload.summary import LoadSummary, summarize

__all__ = ["SimResult", "TraceEvent", "simulate"]


class TraceEvent(NamedTuple):
    """One thing that happened in a simulation, for tests and debugging.

    Attributes:
        time: virtual time in seconds.
        kind: ``admit``, ``reject``, ``dispatch``, ``finish``, ``expire`` or ``late`` (a
            deadline that passed during the pass: answered then, not at the finish).
        ids: the requests concerned, by index in the arrival schedule (a batch's, in order).
        detail: the reason of a ``reject``; empty otherwise.
    """

    time: float
    kind: str
    ids: tuple[int, ...]
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """What a simulation predicts.

    Attributes:
        summary: the figures the load generator and the demo report, in the same keys.
        late: items whose pass finished after their deadline (part of ``timed_out``).
        expired: items whose deadline passed in the queue (part of ``timed_out``).
        batches: forward passes run.
        end_s: virtual time of the last answer.
        stats: the policy's statistics at the end (its counters, its fitted cost model).
        trace: every event in order, when asked for; empty otherwise.
    """

    summary: LoadSummary
    late: int
    expired: int
    batches: int
    end_s: float
    stats: PolicyStats
    trace: tuple[TraceEvent, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The summary's keys, then the simulator's own (``expired``, ``late``, ...)."""
        out = self.summary.to_dict()
        out.update(
            expired=self.expired,
            late=self.late,
            batches=self.batches,
            end_s=self.end_s,
            fitted_fixed_s=self.stats.cost.fixed_s,
            fitted_per_item_s=self.stats.cost.per_item_s,
        )
        if self.stats.tokens is not None:
            out.update(padding_waste=self.stats.tokens.waste)
        return out


def simulate(
    *,
    config: BatchConfig,
    cost: CostEstimate,
    arrivals: Sequence[float],
    timeout_s: float | None = None,
    duration_s: float | None = None,
    drain: bool = False,
    overhead_s: float = 0.0,
    name: str = "simulated",
    trace: bool = False,
    sizes: Sequence[int] | None = None,
    per_token_s: float = 0.0,
    subpass: PassCost | None = None,
) -> SimResult:
    """Run the batching policy against an arrival schedule on virtual time.

    Args:
        config: the batcher's settings, exactly as the server takes them (its
            ``initial_cost`` is what the server's cost model starts from).
        cost: the true cost of a forward pass, ``fixed_s + n * per_item_s`` seconds.
        arrivals: send times in seconds, sorted, >= 0 (see
            :func:`batchserve.workload.arrivals.arrival_times`).
        timeout_s: each request's deadline, from its arrival; None for no deadline.
        duration_s: the schedule's length, for the offered rate and as the least time
            ``ok_per_s`` is counted over (as the demo does); None: the last arrival's time.
        drain: close the policy after the last arrival (nothing more will come), so the
            queue is served without waiting for ``max_wait_s``.
        overhead_s: seconds the driver adds to every pass, on top of ``cost``.
        name: the summary's label.
        trace: record every event in :attr:`SimResult.trace`.
        sizes: each request's tokens, by index in ``arrivals`` (None: not sized, passes by
            count).
        per_token_s: the true cost of each padded token of a pass padded whole (its longest
            item's size times its count), on top of ``cost``; needs ``sizes``.
        subpass: the true cost of a length-sorted sub-pass, as the engines run a pass of
            sized items: each pass costs its planned sub-passes on top of ``cost``; needs
            ``sizes``, and no ``per_token_s``.

    Returns:
        The prediction. It depends only on the arguments.

    Raises:
        ConfigError: ``timeout_s`` is not > 0; ``duration_s``, ``overhead_s`` or
            ``per_token_s`` is negative; ``sizes`` is not one size >= 1 per arrival;
            ``per_token_s`` or ``subpass`` without ``sizes``, or both; or ``config`` asks
            for passes by tokens without ``sizes``.
        ValueError: the arrivals are not sorted or one is negative.
    """
    if timeout_s is not None:
        check_positive("timeout_s", timeout_s)
    if duration_s is not None:
        check_non_negative("duration_s", duration_s)
    check_non_negative("overhead_s", overhead_s)
    check_non_negative("per_token_s", per_token_s)
    _check_sorted(arrivals)
    n = len(arrivals)
    _check_sizes(sizes, n, per_token_s, subpass)
    if duration_s is None:
        duration_s = arrivals[-1] if n else 0.0

    policy: Policy[int] = make_policy(config, sized=sizes is not None)
    by_tokens = sizes is not None and policy.by_tokens
    fixed = cost.fixed_s + overhead_s
    per_item = cost.per_item_s

    def took(live: list[Entry[int]]) -> float:
        t = fixed + len(live) * per_item
        if per_token_s:
            assert sizes is not None
            t += per_token_s * len(live) * max(sizes[e.payload] for e in live)
        elif subpass is not None:
            assert sizes is not None
            s = [sizes[e.payload] for e in live]
            t += predict_s(shape(s, plan(s, subpass)), subpass)
        return t

    workers = Workers[int](config.workers, took)
    # (time, seq, batch): a finish event; batch None is a timer, valid only if seq matches.
    heap: list[tuple[float, int, Batch[int] | None]] = []
    seq = 0
    timer_seq = -1
    timer_at = math.inf
    latencies: list[float] = []
    rejected = dict.fromkeys(REJECT_REASONS, 0)
    late = expired = 0
    end = 0.0
    events: list[TraceEvent] | None = [] if trace else None
    offer = policy.offer
    poll = policy.poll
    finish = policy.finish
    append = latencies.append
    inf = math.inf

    i = 0
    while True:
        if i < n and (not heap or arrivals[i] <= heap[0][0]):
            now = arrivals[i]
            deadline = None if timeout_s is None else now + timeout_s
            admitted = False
            # Arrivals at one instant arrive together: all are offered, then one poll.
            while True:
                try:
                    if by_tokens:
                        assert sizes is not None
                        offer(now, i, deadline, sizes[i])
                    else:
                        offer(now, i, deadline)
                except Rejected as exc:
                    rejected[exc.reason] = rejected.get(exc.reason, 0) + 1
                    if events is not None:
                        events.append(TraceEvent(now, "reject", (i,), exc.reason))
                else:
                    admitted = True
                    if events is not None:
                        events.append(TraceEvent(now, "admit", (i,)))
                i += 1
                if i == n or arrivals[i] != now:
                    break
            if drain and i == n:
                policy.close()
            elif not admitted:
                # As in the Batcher: a refusal changes nothing, so there is nothing to poll.
                continue
        elif heap:
            now, s, batch = heappop(heap)
            if batch is None:
                if s != timer_seq:
                    continue
                timer_at = inf
            else:
                skipped, nxt = workers.end(now, batch)
                finish(now, batch, skipped=skipped)
                if nxt is not None:
                    seq += 1
                    heappush(heap, (nxt[0], seq, nxt[1]))
                for e in batch.entries:
                    if e.withdrawn:
                        continue  # answered at its deadline (during the pass, or prefetched)
                    d = e.deadline
                    if d is None or now <= d:
                        append(now - e.arrival)
                        end = now
                    else:
                        late += 1
                        end = max(end, d)
                if events is not None:
                    events.append(
                        TraceEvent(now, "finish", tuple(e.payload for e in batch.entries))
                    )
        else:
            break

        todo = poll(now)
        if todo.late:
            late += len(todo.late)
            end = now
            if events is not None:
                events.extend(TraceEvent(now, "late", (e.payload,)) for e in todo.late)
        if todo.expired:
            expired += len(todo.expired)
            end = now
            if events is not None:
                events.extend(TraceEvent(now, "expire", (e.payload,)) for e in todo.expired)
        for b in todo.dispatch:
            done = workers.dispatch(now, b)
            if done is not None:
                seq += 1
                heappush(heap, (done, seq, b))
            if events is not None:
                events.append(TraceEvent(now, "dispatch", tuple(e.payload for e in b.entries)))
        wake = todo.wake_at
        if wake is None:
            wake = inf
        if wake != timer_at:
            timer_at = wake
            if wake != inf:
                seq += 1
                timer_seq = seq
                heappush(heap, (wake, seq, None))
            else:
                timer_seq = -1

    span = max(end, duration_s)
    summary = summarize(
        name=name,
        latencies_s=latencies,
        sent=n,
        duration_s=span,
        offered_per_s=n / duration_s if duration_s > 0 else 0.0,
        rejected_by_reason={k: v for k, v in rejected.items() if v},
        timed_out=late + expired,
        errors=0,
        items=workers.items,
        batches=workers.passes,
        max_batch_size=config.max_batch_size,
        max_wait_s=config.max_wait_s,
    )
    return SimResult(
        summary=summary,
        late=late,
        expired=expired,
        batches=workers.passes,
        end_s=end,
        stats=policy.statistics(),
        trace=tuple(events) if events is not None else (),
    )


def _check_sizes(
    sizes: Sequence[int] | None, n: int, per_token_s: float, subpass: PassCost | None
) -> None:
    if per_token_s and subpass is not None:
        raise ConfigError(
            "per_token_s and subpass are two shapes of a pass (padded whole, sorted "
            "sub-passes): give one"
        )
    if sizes is None:
        if per_token_s:
            raise ConfigError("per_token_s needs sizes: each request's tokens")
        if subpass is not None:
            raise ConfigError("subpass needs sizes: each request's tokens")
        return
    if len(sizes) != n:
        raise ConfigError(f"sizes must hold one size per arrival ({n}), got {len(sizes)}")
    for i, size in enumerate(sizes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"sizes[{i}] must be an integer >= 1, got {size!r}")


def _check_sorted(arrivals: Sequence[float]) -> None:
    prev = 0.0
    for i, t in enumerate(arrivals):
        if not t >= prev:
            rule = "must be >= 0" if i == 0 else "must be sorted"
            raise ValueError(f"arrivals {rule}: arrivals[{i}] is {t!r} after {prev!r}")
        prev = t
