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
  ``tokens_s = per_token_s * n * L``. An engine that compiles per shape (OpenVINO) plans on
  a :class:`~batchserve.subpasses.ShapeGrid` (``grid``, with the model's ``window``): the
  plan is made on it, each sub-pass runs at its longest item's length rounded up to the
  grid and costs that width. ``tokens`` (each item's tokens as the engine counts them,
  when they differ from the estimates ``sizes`` the policy is handed) are what the plan
  and the cost see. The policy's own cost models learn
  ``now - batch.start``, which here is exactly that. ``overhead_s`` (0 by default: a server
  with no overhead of its own) stands for what a real driver adds to each pass: handing the
  batch to a worker thread and the answer back to the event loop, the timer slack of the
  model's own waits.

With ``sizes`` (each item's tokens) the policy is the server's for a model that counts
tokens (:func:`~batchserve.policy.make_policy`: by tokens unless ``batch_by`` is ``count``),
and every item is offered with its size, as the Batcher does.

A request may carry several items (``items_per_request``: texts in one embeddings
request). Its items are offered together at its arrival, as the server's
:class:`~batchserve.server.exchange.Exchange` offers a request's inputs: a refusal of one
refuses the request and withdraws those admitted; an item that expires in the queue, or
whose deadline passes during its pass, times the request out and withdraws the rest; the
request is ``ok`` when its last item finishes by its deadline, its latency that finish
minus its arrival. The summary counts requests, as the load generator does
(:attr:`SimResult.items_ok_per_s` counts items).

After each event it calls ``poll(now)`` and carries the answer out at once: expired items
are answered at ``now``, each dispatched batch gets its finish event, the timer is re-armed.
Arrivals at the same instant arrive together: all are offered, then the policy is polled
once, so a backlog present at time 0 is queued whole before the first batch is formed.

The events run on the simulator's one event loop (:mod:`batchserve.sim.loop`: a heap keyed
``(time, seq)``, the arrival schedule merged in first at equal times), with one replica; this
module says what an arrival is and what an answer counts for. Nothing reads the wall clock
or the global random state, so the same inputs give the same result, bit for bit.

Outcomes follow the Batcher: an item finished by its deadline is ``ok`` with latency
``finish - arrival``; one whose pass ends after its deadline is ``late`` (its caller was
answered ``DeadlineExceeded`` at the deadline); one whose deadline passes in the queue is
``expired``. Late and expired items are both reported as ``timed_out``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from batchserve.config import BatchConfig, CostEstimate, check_non_negative, check_positive
from batchserve.errors import ConfigError, Rejected
from batchserve.policy import (
    REJECT_REASONS,
    Actions,
    Batch,
    Entry,
    Policy,
    PolicyStats,
    make_policy,
)
from batchserve.policy.entries import DONE
from batchserve.sim.loop import check_sorted, run_events
from batchserve.sim.workers import Workers
from batchserve.subpasses import PassCost, ShapeGrid, plan, predict_s, shape
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
        items_per_request: items each request carried.
    """

    summary: LoadSummary
    late: int
    expired: int
    batches: int
    end_s: float
    stats: PolicyStats
    trace: tuple[TraceEvent, ...] = ()
    items_per_request: int = 1

    @property
    def items_ok_per_s(self) -> float:
        """Items of successful requests per second (texts/s of embeddings requests)."""
        return self.summary.ok_per_s * self.items_per_request

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
    subpass_busy: PassCost | None = None,
    grid: ShapeGrid | None = None,
    window: int | None = None,
    tokens: Sequence[int] | None = None,
    items_per_request: int = 1,
) -> SimResult:
    """Run the batching policy against an arrival schedule on virtual time.

    Args:
        config: the batcher's settings, exactly as the server takes them (its
            ``initial_cost`` is what the server's cost model starts from).
        cost: the true cost of a forward pass, ``fixed_s + n * per_item_s`` seconds.
        arrivals: requests' send times in seconds, sorted, >= 0 (see
            :func:`batchserve.workload.arrivals.arrival_times`).
        timeout_s: each request's deadline, from its arrival; None for no deadline.
        duration_s: the schedule's length, for the offered rate and as the least time
            ``ok_per_s`` is counted over (as the demo does); None: the last arrival's time.
        drain: close the policy after the last arrival (nothing more will come), so the
            queue is served without waiting for ``max_wait_s``.
        overhead_s: seconds the driver adds to every pass, on top of ``cost``.
        name: the summary's label.
        trace: record every event in :attr:`SimResult.trace`.
        sizes: each item's tokens as the policy is told them (the model's estimate), request
            ``i``'s items at ``i * items_per_request`` onwards (None: not sized, passes by
            count).
        per_token_s: the true cost of each padded token of a pass padded whole (its longest
            item's size times its count), on top of ``cost``; needs ``sizes``.
        subpass: the true cost of a length-sorted sub-pass, as the engines run a pass of
            sized items: each pass costs its planned sub-passes on top of ``cost``; needs
            ``sizes``, and no ``per_token_s``.
        subpass_busy: the true cost of a sub-pass of a pass that begins while every other
            worker runs one (passes sharing the machine's cores and memory run slower than
            alone; None: ``subpass``); the plan is made with ``subpass``; needs ``subpass``.
        grid: the shapes the engine's sub-passes are planned on and run at (None: any);
            needs ``subpass``.
        window: the model's window in tokens, capping the grid's rounding.
        tokens: each item's tokens as the engine counts them, what its plan and its cost
            see (None: ``sizes``); needs ``subpass`` or ``per_token_s``.
        items_per_request: items each request carries, offered together (>= 1).

    Returns:
        The prediction. It depends only on the arguments.

    Raises:
        ConfigError: ``timeout_s`` is not > 0; ``duration_s``, ``overhead_s`` or
            ``per_token_s`` is negative; ``items_per_request`` is not >= 1; ``sizes`` or
            ``tokens`` is not one size >= 1 per item; ``per_token_s`` or ``subpass`` without
            ``sizes``, or both; ``grid`` without ``subpass``; ``tokens`` without either; or
            ``config`` asks for passes by tokens without ``sizes``.
        ValueError: the arrivals are not sorted or one is negative.
    """
    if timeout_s is not None:
        check_positive("timeout_s", timeout_s)
    if duration_s is not None:
        check_non_negative("duration_s", duration_s)
    check_non_negative("overhead_s", overhead_s)
    check_non_negative("per_token_s", per_token_s)
    check_sorted(arrivals)
    check_positive("items_per_request", items_per_request)
    n = len(arrivals)
    k = int(items_per_request)
    _check_sizes(sizes, n * k, per_token_s, subpass)
    _check_engine(sizes, tokens, n * k, per_token_s, subpass, subpass_busy, grid)
    if duration_s is None:
        duration_s = arrivals[-1] if n else 0.0

    policy: Policy[int] = make_policy(config, sized=sizes is not None)
    by_tokens = sizes is not None and policy.by_tokens
    fixed = cost.fixed_s + overhead_s
    per_item = cost.per_item_s
    seen = tokens if tokens is not None else sizes
    busy_cost = subpass_busy if config.workers > 1 else None

    def took(live: list[Entry[int]]) -> float:
        t = fixed + len(live) * per_item
        if per_token_s:
            assert seen is not None
            t += per_token_s * len(live) * max(seen[e.payload] for e in live)
        elif subpass is not None:
            assert seen is not None
            lengths = [seen[e.payload] for e in live]
            priced = busy_cost if workers.busy == config.workers else None
            t += _subpasses_s(lengths, subpass, priced, grid, window)
        return t

    workers = Workers[int](config.workers, took)
    events: list[TraceEvent] | None = [] if trace else None
    driver: _Single | _Grouped
    if k == 1:
        driver = _Single(policy, arrivals, timeout_s, sizes if by_tokens else None, drain, events)
    else:
        driver = _Grouped(
            policy, arrivals, k, timeout_s, sizes if by_tokens else None, drain, events
        )
    run_events(arrivals, [policy], [workers], driver)
    latencies, rejected, late, expired, end = (
        driver.latencies,
        driver.rejected,
        driver.late,
        driver.expired,
        driver.end,
    )

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
        items_per_request=k,
    )


def _subpasses_s(
    lengths: list[int],
    cost: PassCost,
    priced: PassCost | None,
    grid: ShapeGrid | None,
    window: int | None,
) -> float:
    """What a pass of these lengths costs in the engine's sub-passes (priced: busy)."""
    # Planned with ``cost``, as the engine plans; priced with ``priced`` when given.
    groups = plan(lengths, cost, grid=grid, window=window)
    if grid is not None:  # each sub-pass runs at its longest rounded up to the grid
        lengths = [grid.width(x, window) for x in lengths]
    return predict_s(shape(lengths, groups), priced or cost)


class _Driver:
    """What :func:`simulate`'s two drivers share: their settings, their tallies, an offer."""

    def __init__(
        self,
        policy: Policy[int],
        arrivals: Sequence[float],
        timeout_s: float | None,
        sizes: Sequence[int] | None,
        drain: bool,
        events: list[TraceEvent] | None,
    ) -> None:
        self.policy = policy
        self.arrivals = arrivals
        self.timeout_s = timeout_s
        self.sizes = sizes
        self.drain = drain
        self.events = events
        self.latencies: list[float] = []
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.late = 0
        self.expired = 0
        self.end = 0.0

    def _offer(self, now: float, i: int, deadline: float | None) -> Entry[int]:
        # Item ``i``, with its size when passes are formed by tokens.
        sizes = self.sizes
        if sizes is not None:
            return self.policy.offer(now, i, deadline, sizes[i])
        return self.policy.offer(now, i, deadline)

    def _record(self, now: float, key: int, refusal: Rejected | None) -> None:
        # One arrival's answer at the door: a refusal is counted by reason.
        if refusal is not None:
            self.rejected[refusal.reason] = self.rejected.get(refusal.reason, 0) + 1
        if self.events is not None:
            if refusal is None:
                self.events.append(TraceEvent(now, "admit", (key,)))
            else:
                self.events.append(TraceEvent(now, "reject", (key,), refusal.reason))

    def _arrived(self, last: int, admitted: bool) -> Sequence[int]:
        # Poll once if one was admitted, or the policy now drains (the last arrival). As in
        # the Batcher: a refusal changes nothing, so there is nothing to poll.
        if self.drain and last == len(self.arrivals):
            self.policy.close()
            return _ONE
        return _ONE if admitted else ()

    def released(self, replica: int, now: float) -> None:
        """Not asked for."""


class _Single(_Driver):
    """:func:`simulate` as the event loop's driver: one replica, one request an item."""

    def arrive(self, now: float, first: int, last: int) -> Sequence[int]:
        """Offer each arrival; poll once if one was admitted (or the policy now drains)."""
        timeout_s = self.timeout_s
        deadline = None if timeout_s is None else now + timeout_s
        admitted = False
        for i in range(first, last):
            try:
                self._offer(now, i, deadline)
            except Rejected as exc:
                self._record(now, i, exc)
            else:
                admitted = True
                self._record(now, i, None)
        return self._arrived(last, admitted)

    def polled(self, replica: int, now: float, actions: Actions[int]) -> None:
        """Late and expired items are answered now."""
        events = self.events
        if actions.late:
            self.late += len(actions.late)
            self.end = now
            if events is not None:
                events.extend(TraceEvent(now, "late", (e.payload,)) for e in actions.late)
        if actions.expired:
            self.expired += len(actions.expired)
            self.end = now
            if events is not None:
                events.extend(TraceEvent(now, "expire", (e.payload,)) for e in actions.expired)
        if events is not None:
            for b in actions.dispatch:
                events.append(TraceEvent(now, "dispatch", tuple(e.payload for e in b.entries)))

    def finished(
        self, replica: int, now: float, batch: Batch[int], skipped: list[Entry[int]]
    ) -> None:
        """Each item still awaited is ``ok`` by its deadline, else ``late``."""
        append = self.latencies.append
        for e in batch.entries:
            if e.withdrawn:
                continue  # answered at its deadline (during the pass, or prefetched)
            d = e.deadline
            if d is None or now <= d:
                append(now - e.arrival)
                self.end = now
            else:
                self.late += 1
                self.end = max(self.end, d)
        if self.events is not None:
            self.events.append(TraceEvent(now, "finish", tuple(e.payload for e in batch.entries)))


class _Grouped(_Driver):
    """:func:`simulate` as the event loop's driver: one replica, requests of ``k`` items.

    Item ``i * k + j`` is request ``i``'s ``j``-th (the payload); outcomes count requests.
    """

    def __init__(
        self,
        policy: Policy[int],
        arrivals: Sequence[float],
        k: int,
        timeout_s: float | None,
        sizes: Sequence[int] | None,
        drain: bool,
        events: list[TraceEvent] | None,
    ) -> None:
        super().__init__(policy, arrivals, timeout_s, sizes, drain, events)
        self.k = k
        n = len(arrivals)
        self.remaining = [k] * n
        self.done = [False] * n
        self.entries: list[list[Entry[int]]] = [[] for _ in range(n)]

    def _withdraw(self, now: float, r: int) -> None:
        self.done[r] = True
        for e in self.entries[r]:
            if e.state != DONE:
                self.policy.cancel(now, e)

    def _time_out(self, now: float, r: int, late: bool) -> None:
        # The request's first item to miss answers it (at ``now``) and withdraws the rest.
        if self.done[r]:
            return
        if late:
            self.late += 1
        else:
            self.expired += 1
        self.end = max(self.end, now)
        self._withdraw(now, r)
        if self.events is not None:
            self.events.append(TraceEvent(now, "late" if late else "expire", (r,)))

    def arrive(self, now: float, first: int, last: int) -> Sequence[int]:
        """Offer each request's items; a refusal of one refuses (and withdraws) them all."""
        timeout_s = self.timeout_s
        deadline = None if timeout_s is None else now + timeout_s
        k = self.k
        admitted = False
        for r in range(first, last):
            mine = self.entries[r]
            try:
                for i in range(r * k, r * k + k):
                    mine.append(self._offer(now, i, deadline))
            except Rejected as exc:
                self._withdraw(now, r)
                self._record(now, r, exc)
            else:
                admitted = True
                self._record(now, r, None)
        return self._arrived(last, admitted)

    def polled(self, replica: int, now: float, actions: Actions[int]) -> None:
        """An item late or expired times its request out now."""
        k = self.k
        for e in actions.late:
            self._time_out(now, e.payload // k, True)
        for e in actions.expired:
            self._time_out(now, e.payload // k, False)
        if self.events is not None:
            for b in actions.dispatch:
                self.events.append(TraceEvent(now, "dispatch", tuple(e.payload for e in b.entries)))

    def finished(
        self, replica: int, now: float, batch: Batch[int], skipped: list[Entry[int]]
    ) -> None:
        """A request is ``ok`` when its last item finishes by its deadline."""
        k, done, remaining = self.k, self.done, self.remaining
        for e in batch.entries:
            r = e.payload // k
            if done[r] or e.withdrawn:
                continue
            if e.deadline is not None and now > e.deadline:
                self._time_out(now, r, True)
                continue
            remaining[r] -= 1
            if not remaining[r]:
                done[r] = True
                self.latencies.append(now - self.arrivals[r])
                self.end = now
        if self.events is not None:
            self.events.append(TraceEvent(now, "finish", tuple(e.payload for e in batch.entries)))


_ONE = (0,)


def _check_engine(
    sizes: Sequence[int] | None,
    tokens: Sequence[int] | None,
    n: int,
    per_token_s: float,
    subpass: PassCost | None,
    subpass_busy: PassCost | None,
    grid: ShapeGrid | None,
) -> None:
    if grid is not None and subpass is None:
        raise ConfigError("grid needs subpass: the grid is where the sub-passes are planned")
    if subpass_busy is not None and subpass is None:
        raise ConfigError("subpass_busy needs subpass: what a sub-pass costs alone")
    if tokens is None:
        return
    if subpass is None and not per_token_s:
        raise ConfigError("tokens needs subpass or per_token_s: they are what a pass costs")
    if sizes is None:
        raise ConfigError("tokens needs sizes: what the policy is told of each item")
    if len(tokens) != n:
        raise ConfigError(f"tokens must hold one count per item ({n}), got {len(tokens)}")
    for i, size in enumerate(tokens):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"tokens[{i}] must be an integer >= 1, got {size!r}")


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
        raise ConfigError(f"sizes must hold one size per item ({n}), got {len(sizes)}")
    for i, size in enumerate(sizes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"sizes[{i}] must be an integer >= 1, got {size!r}")
