"""The asyncio driver of the batching policy.

Theory of operation
-------------------
:class:`Batcher` owns one :class:`~batchserve.policy.Policy` and drives it with an injected
:class:`~batchserve.clock.Clock`. Every event (a submission, a cancellation, a timer, a
finished forward pass) is handed to the policy with the clock's time, and the policy's
answer is carried out at once in ``_pump``: expired items (deadline passed in the queue) and
late ones (deadline passed during their pass) get ``DeadlineExceeded``, batches start on the
workers, and one timer is (re)armed for the policy's ``wake_at``. Every deadline is the
policy's to track; the driver writes no policy state.

One runner with two variants carries a pass: a sync model runs on one of ``workers`` threads
(:mod:`~batchserve.batcher.threads`; the event loop keeps admitting and forming the next
batch during a forward pass) and comes back with one loop callback; an async model runs as a
task on the loop. Just before the pass, inside the worker, items whose caller already left
are dropped: the model never runs for a caller who is gone. If the model raises, the batch
is bisected (:mod:`batchserve.bisection`) so only the failing inputs' callers get a
``ModelError``.

Each item is answered through its :class:`~batchserve.batcher.answers.Waiter`, a plain
callback object with no task, future or timer of its own: :meth:`Batcher.offer` is that
form, for drivers that answer on a connection directly (the HTTP server).
:meth:`Batcher.submit_nowait` and :meth:`Batcher.submit` wrap it for Python callers: their
:class:`Ticket` is the waiter and holds an asyncio future. A caller whose deadline passes
while its item is running is answered ``DeadlineExceeded`` at the deadline, not when the
pass ends (the item is then counted ``late``). A caller that leaves
(:meth:`Batcher.withdraw`, or a cancelled ticket) removes its item from the queue if it is
still there, or has it skipped before its pass.

The policy is composed of two parameters (:func:`~batchserve.policy.make_policy`). With
``classes`` (:class:`~batchserve.policy.ClassConfig`) its queue is a queue per class of work
and a lane per tenant: each item names its class of work and tenant (``priority=`` and
``tenant=`` of :meth:`Batcher.submit_nowait`, ``work_class`` and ``tenant`` of
:meth:`Batcher.offer`); without, one FIFO queue, which reads neither. A model that counts
its inputs' tokens (a ``token_estimate(input) -> int`` method, or the ``sizer`` argument)
gets passes formed by tokens by default (``batch_by="auto"``), with or without classes:
each item is offered with its tokens, and passes are formed by tokens (texts of similar
length together, ``max_batch_tokens``).

All methods must be called from the event loop thread that runs the batcher.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, cast

from batchserve.batcher.answers import (
    BatchRecord,
    Item,
    Out,
    Served,
    Ticket,
    Waiter,
    settle_error,
)
from batchserve.batcher.threads import Threads
from batchserve.bisection import BisectResult, run_async, run_sync
from batchserve.clock import Clock, MonotonicClock, TimerHandle
from batchserve.config import BatchConfig, check_positive
from batchserve.errors import ConfigError, DeadlineExceeded, Rejected, ShuttingDown
from batchserve.models.base import AsyncBatchFn, BatchFn, SyncBatchFn, is_async_model
from batchserve.policy import (
    Batch,
    ClassConfig,
    Counters,
    Entry,
    Policy,
    PolicyStats,
    WorkClass,
    make_policy,
)

__all__ = ["Batcher"]

_log = logging.getLogger("batchserve")


class Batcher(Generic[Out]):
    """Dynamic batching in front of a model.

    Args:
        model: a sync or async function from a list of inputs to a list of outputs of the
            same length and order.
        config: batching settings (see :class:`~batchserve.config.BatchConfig`).
        clock: the time source; real monotonic time by default.
        timeout_s: the deadline applied to submissions that give none (None: no deadline).
        on_batch: called on the loop with a :class:`BatchRecord` after each forward pass.
        classes: classes of work and tenants (None: one FIFO queue); a class's own
            ``timeout_s`` replaces ``timeout_s`` for its submissions.
        sizer: an input's tokens, for passes formed by tokens (default: the model's
            ``token_estimate`` method, if it has one).

    Raises:
        ConfigError: ``batch_by`` is ``tokens`` but nothing sizes the inputs.

    Use it as ``async with Batcher(model) as b: out = await b.submit(x)``; leaving the block
    drains (finishes every accepted item).
    """

    def __init__(
        self,
        model: BatchFn,
        config: BatchConfig | None = None,
        *,
        clock: Clock | None = None,
        timeout_s: float | None = None,
        on_batch: Callable[[BatchRecord], None] | None = None,
        classes: ClassConfig | None = None,
        sizer: Callable[[Any], int] | None = None,
    ) -> None:
        self.config = config if config is not None else BatchConfig()
        if timeout_s is not None:
            check_positive("timeout_s", timeout_s)
        self.timeout_s = timeout_s
        self._model = model
        self._async = is_async_model(model)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self.classes = classes
        if sizer is None:
            sizer = getattr(model, "token_estimate", None)
        self._policy: Policy[Item] = make_policy(
            self.config, sized=sizer is not None, classes=classes
        )
        # None unless the policy forms passes by tokens: then every item is sized.
        self._sizer = sizer if self._policy.by_tokens else None
        self._on_batch = on_batch
        self._threads: Threads[Batch[Item], _Pass] | None = None
        self._timer: TimerHandle | None = None
        self._timer_at = math.inf
        self._tasks: set[asyncio.Task[None]] = set()
        # An async model's passes on the loop now, and the prefetched ones waiting to begin
        # when one ends (a sync model's wait in its worker threads' queue instead).
        self._on_loop = 0
        self._waiting: deque[Batch[Item]] = deque()
        self._idle: asyncio.Event | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Batcher[Out]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown(drain=exc is None)

    @property
    def clock(self) -> Clock:
        """The clock the batcher reads time from."""
        return self._clock

    @property
    def closed(self) -> bool:
        """Whether ``shutdown`` has begun: new submissions are refused."""
        return self._policy.draining

    @property
    def batch_by(self) -> str:
        """How passes are formed: ``tokens`` or ``count`` (``auto`` resolved)."""
        return "tokens" if self._policy.by_tokens else "count"

    def statistics(self) -> PolicyStats:
        """A frozen snapshot: queue depth, outcome counters, batch sizes, fitted cost model."""
        return self._policy.statistics()

    def class_statistics(self) -> dict[str, dict[str, Counters]]:
        """Outcome counters by class, then tenant label (empty without classes)."""
        return self._policy.class_statistics()

    def class_depths(self) -> dict[str, int]:
        """Items of each class waiting now (empty without classes)."""
        return self._policy.class_depths()

    def work_class(self, priority: str | int | None) -> WorkClass:
        """The class a submission's ``priority`` names (a name, a level, or None: default).

        Raises:
            ConfigError: the batcher has no classes, or ``priority`` names none of them.
        """
        wc = self._policy.work_class(priority)
        if wc is None:
            raise ConfigError(f"priority {priority!r} given, but the batcher has no classes")
        return wc

    async def shutdown(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Refuse new work, then finish (``drain=True``) or drop what is queued.

        With ``drain=True`` every accepted item is run and answered, without waiting for
        ``max_wait_s`` since nothing more will arrive. With ``drain=False`` queued items (and
        those of prefetched batches, whose passes have not begun) are answered
        ``ShuttingDown`` (counted ``cancelled``); running passes still finish. Blocks
        until nothing is queued or running, or ``timeout_s`` seconds have passed (then the
        queue is dropped as with ``drain=False``). Safe to call twice.
        """
        self._policy.close()
        if not drain:
            self._drop_queue()
        self._pump()
        t0 = self._clock.now()
        try:
            await asyncio.wait_for(self.wait_idle(), timeout_s)
        except TimeoutError:
            self._drop_queue()
            self._pump()
        if self._tasks:
            left = None if timeout_s is None else max(0.0, timeout_s - (self._clock.now() - t0))
            await asyncio.wait(set(self._tasks), timeout=left)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._threads is not None:
            self._threads.shutdown()

    async def wait_idle(self) -> None:
        """Block until nothing is queued or running."""
        if self._idle is None:
            self._idle = asyncio.Event()
        while not self._policy.idle:
            self._idle.clear()
            await self._idle.wait()

    def _drop_queue(self) -> None:
        now = self._clock.now()
        # Prefetched entries too: their passes have not begun, so to their callers they are
        # still queued (a pass skips an entry withdrawn before it begins).
        for entry in self._policy.queued(prefetched=True):
            self._policy.cancel(now, entry)
            settle_error(entry, ShuttingDown("the batcher shut down", retry_after_s=1.0))

    # -- submission ------------------------------------------------------------------------

    def submit_nowait(
        self,
        item: Any,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
        priority: str | int | None = None,
        tenant: str | None = None,
    ) -> Ticket[Out]:
        """Admit ``item`` at once or refuse it; never waits.

        Args:
            item: one input for the model.
            timeout_s: seconds from now by which it must finish (default: the batcher's).
            deadline: an absolute time on the batcher's clock instead of ``timeout_s``.
            priority: its class of work, by name or level (1 = first class; None or 0: the
                default class). Needs ``classes``.
            tenant: who it is for (fair shares and queue bounds among tenants).

        Returns:
            A :class:`Ticket`; await it for the :class:`Served` answer. Awaiting raises
            ``DeadlineExceeded`` at the deadline, ``ModelError`` if the model raised for this
            input, ``ShuttingDown`` if dropped by a non-draining shutdown.

        Raises:
            QueueFull, DeadlineInfeasible, ShuttingDown: refused at once; each carries
                ``retry_after_s``.
            ConfigError: ``timeout_s`` is not a positive number, or ``priority`` names no
                class.
        """
        # A class's own timeout replaces the batcher's; without classes a priority is refused.
        wc = self._policy.work_class(priority)
        work_class = None if wc is None else wc.name
        default_s = self.timeout_s if wc is None or wc.timeout_s is None else wc.timeout_s
        if deadline is None:
            t = timeout_s if timeout_s is not None else default_s
            if t is not None:
                deadline = self._clock.now() + check_positive("timeout_s", t)
        future: asyncio.Future[Served[Out]] = asyncio.get_running_loop().create_future()
        ticket = Ticket(self, future)
        ticket._entry = self.offer(item, deadline, ticket, 0, work_class, tenant)
        future.add_done_callback(ticket._on_done)
        return ticket

    async def submit(
        self,
        item: Any,
        *,
        timeout_s: float | None = None,
        deadline: float | None = None,
        priority: str | int | None = None,
        tenant: str | None = None,
    ) -> Out:
        """Submit ``item`` and wait for its output.

        Raises:
            QueueFull, DeadlineInfeasible, ShuttingDown: refused at once.
            DeadlineExceeded: not finished by its deadline.
            ModelError: the model raised for this input.

        On cancellation the item leaves the queue (or is skipped before its pass).
        """
        served = await self.submit_nowait(
            item, timeout_s=timeout_s, deadline=deadline, priority=priority, tenant=tenant
        )
        return served.output

    def offer(
        self,
        item: Any,
        deadline: float | None,
        waiter: Waiter,
        index: int = 0,
        work_class: str | None = None,
        tenant: str | None = None,
    ) -> Entry[Item]:
        """Admit ``item`` at once or refuse it; its answer goes to ``waiter.settle(index, ...)``.

        The callback form of :meth:`submit_nowait`, with no future, task or timer per item:
        for drivers that answer on a connection directly. ``deadline`` is absolute on the
        batcher's clock (None: no deadline; the batcher's ``timeout_s`` is not applied).
        ``work_class`` names its class (None: the default) and ``tenant`` its tenant; both are
        ignored without ``classes``.

        Returns:
            The policy's entry: hand it to :meth:`withdraw` if the caller leaves.

        Raises:
            QueueFull, DeadlineInfeasible, ShuttingDown: refused at once.
            ConfigError: ``work_class`` names no class.
        """
        now = self._clock.now()
        sizer = self._sizer
        entry = self._policy.offer(
            now,
            Item(item, waiter, index),
            deadline,
            1 if sizer is None else sizer(item),
            work_class=work_class,
            tenant=tenant,
        )
        # Most offers change nothing a poll would act on before the timer (every worker
        # busy, or the pass waiting out its max wait): no poll for those.
        if self._policy.poll_due(now, self._timer_at):
            self._pump()
        return entry

    def screen(
        self, deadline: float | None, work_class: str | None = None, tenant: str | None = None
    ) -> Rejected | None:
        """Whether one more item with ``deadline`` would be refused now, before it is read.

        Lets a server refuse a request from its head alone (its inputs are not parsed yet).
        A refusal is counted as one refused item; None admits nothing and counts nothing.
        ``work_class`` and ``tenant`` are as for :meth:`offer`.
        """
        return self._policy.screen(self._clock.now(), deadline, work_class, tenant)

    def withdraw(self, entry: Entry[Item]) -> None:
        """The caller of ``entry`` left: it leaves the queue, or is skipped before its pass."""
        if self._policy.cancel(self._clock.now(), entry):
            self._pump()

    # -- the pump --------------------------------------------------------------------------

    def _pump(self) -> None:
        now = self._clock.now()
        todo = self._policy.poll(now)
        for entry in todo.expired:
            waited = now - entry.arrival
            settle_error(
                entry, DeadlineExceeded(f"deadline passed after {waited:.4f}s in the queue")
            )
        for entry in todo.late:
            settle_error(entry, _late(entry, now))
        for batch in todo.dispatch:
            self._start(batch)
        self._arm(todo.wake_at)
        if self._policy.idle and self._idle is not None:
            self._idle.set()

    def _arm(self, when: float | None) -> None:
        when = math.inf if when is None else when
        if when == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = when
        if when != math.inf:
            self._timer = self._clock.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self._pump()

    # -- forward passes --------------------------------------------------------------------

    def _start(self, batch: Batch[Item]) -> None:
        # One runner, two variants: a sync model's pass runs in a worker thread and comes
        # back with one loop callback; an async model's pass is a task on the loop. Both
        # take the live entries the same way and end in ``_complete`` (or ``_fail``).
        if self._async:
            if self._on_loop < self.config.workers:
                self._on_loop += 1
                task = asyncio.get_running_loop().create_task(self._run_on_loop(batch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                self._waiting.append(batch)  # prefetched: it begins when a pass ends
            return
        if self._threads is None:
            loop = asyncio.get_running_loop()
            self._threads = Threads(
                self.config.workers, loop, self._run_in_thread, self._thread_done
            )
        self._threads.submit(batch)

    def _run_in_thread(self, batch: Batch[Item]) -> _Pass:
        # Runs in a worker thread: the last check for callers who left, then the pass.
        live, inputs = _live(batch)
        t0 = self._clock.now()
        result = run_sync(cast(SyncBatchFn, self._model), inputs, self.config.max_bisect_calls)
        return live, result, self._clock.now() - t0

    def _thread_done(self, batch: Batch[Item], outcome: _Pass | BaseException) -> None:
        if isinstance(outcome, BaseException):
            self._fail(batch, outcome)
        else:
            self._complete(batch, *outcome)

    async def _run_on_loop(self, batch: Batch[Item]) -> None:
        try:
            live, inputs = _live(batch)
            t0 = self._clock.now()
            model = cast(AsyncBatchFn, self._model)
            result = await run_async(model, inputs, self.config.max_bisect_calls)
            forward_s = self._clock.now() - t0
        except BaseException as exc:
            self._on_loop -= 1
            self._fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._on_loop -= 1
        self._complete(batch, live, result, forward_s)

    def _fail(self, batch: Batch[Item], exc: BaseException) -> None:
        # A fault of the engine itself (not of the model): no caller may hang on it.
        self._policy.finish(self._clock.now(), batch, failed=batch.entries)
        if self._waiting:
            self._start(self._waiting.popleft())
        for e in batch.entries:
            if not e.withdrawn:
                settle_error(e, exc)
        self._pump()

    def _complete(
        self,
        batch: Batch[Item],
        live: list[Entry[Item]],
        result: BisectResult,
        forward_s: float,
    ) -> None:
        now = self._clock.now()
        live_ids = {e.id for e in live}
        skipped = [e for e in batch.entries if e.id not in live_ids]
        failed = [live[i] for i in result.errors]
        self._policy.finish(
            now,
            batch,
            failed=failed,
            skipped=skipped,
            bisect_calls=result.extra_calls,
        )
        if self._waiting:
            self._start(self._waiting.popleft())  # the policy has just begun it
        # The worker is free: the next batch starts before this one's callers are answered
        # (answering writes to their connections, which the next pass need not wait for).
        self._pump()
        errors = result.errors
        outputs = result.outputs
        size = len(live)
        start = batch.start
        for i, e in enumerate(live):
            if e.withdrawn:  # answered at its deadline during the pass, or its caller left
                continue
            item = e.payload
            err = errors.get(i) if errors else None
            if err is not None:
                item.waiter.settle(item.index, None, err)
            elif e.deadline is not None and now > e.deadline:
                # The deadline timer had no chance to run (a busy loop): a late answer is
                # still a 504, never a success after the deadline. Counted ``late``.
                item.waiter.settle(item.index, None, _late(e, now))
            else:
                served = Served(
                    output=outputs[i],
                    queue_wait_s=start - e.arrival,
                    forward_s=forward_s,
                    batch_size=size,
                    batch_id=batch.id,
                )
                item.waiter.settle(item.index, served, None)
        if self._on_batch is not None:
            self._notify(
                BatchRecord(
                    batch_id=batch.id,
                    size=len(live),
                    forward_s=forward_s,
                    queue_waits_s=tuple(batch.start - e.arrival for e in live),
                    failed=len(failed),
                    skipped=len(skipped),
                    bisect_calls=result.extra_calls,
                )
            )

    def _notify(self, record: BatchRecord) -> None:
        assert self._on_batch is not None
        try:
            self._on_batch(record)
        except Exception:
            # A listener's fault must not stall the engine; it is logged, not raised.
            _log.exception("on_batch listener raised")


#: What a pass hands back: the entries it ran, their results, its forward time.
_Pass = tuple[list[Entry[Item]], BisectResult, float]


def _live(batch: Batch[Item]) -> tuple[list[Entry[Item]], list[Any]]:
    """The entries whose callers are still there, and their inputs: the model runs these."""
    live = [e for e in batch.entries if not e.withdrawn]
    return live, [e.payload.input for e in live]


def _late(entry: Entry[Item], now: float) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"deadline passed after {now - entry.arrival:.4f}s, while its forward pass was running",
        during_pass=True,
    )
