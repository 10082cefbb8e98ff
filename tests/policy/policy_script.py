"""Random event scripts for the policies' Hypothesis tests, and the driving they share.

A script is a list of events (:class:`Offer`, :class:`Cancel`, :class:`Finish`,
:class:`Tick`); :class:`Script` plays it against a policy on a virtual clock: it cancels,
finishes and ticks by itself, hands each offer to the test, calls the test's ``step`` (its
``poll`` and checks) after every event, and at the end drains the policy to idle. What is
checked stays in each test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from batchserve.config import BatchConfig, CostEstimate
from batchserve.policy import Batch, Entry, Policy

__all__ = ["Cancel", "Finish", "Offer", "Script", "Tick", "configs", "events"]


@dataclass
class Offer:
    dt: float
    timeout: float | None
    size: int = 1
    work_class: int = 0
    tenant: int = 0


@dataclass
class Cancel:
    pick: int


@dataclass
class Finish:
    dt: float
    pick: int
    fail_first: bool


@dataclass
class Tick:
    dt: float


times = st.floats(min_value=0.0, max_value=0.02, allow_nan=False)
timeouts = st.one_of(st.none(), st.floats(min_value=0.001, max_value=0.1))


def events(offers: st.SearchStrategy[Offer], max_size: int) -> st.SearchStrategy[list[Any]]:
    """Scripts of up to ``max_size`` events, offers drawn from ``offers``."""
    return st.lists(
        st.one_of(
            offers,
            st.builds(Cancel, st.integers(0, 50)),
            st.builds(Finish, times, st.integers(0, 5), st.booleans()),
            st.builds(Tick, times),
        ),
        max_size=max_size,
    )


def configs(max_queue: int) -> st.SearchStrategy[BatchConfig]:
    """Small batchers: every bound is hit within a script."""
    return st.builds(
        BatchConfig,
        max_batch_size=st.integers(1, 6),
        max_wait_s=st.sampled_from([0.0, 0.001, 0.005]),
        queue_size=st.integers(1, max_queue),
        workers=st.integers(1, 3),
        admission=st.booleans(),
        prefetch=st.booleans(),
        initial_cost=st.builds(
            CostEstimate,
            fixed_s=st.sampled_from([0.0, 0.002]),
            per_item_s=st.sampled_from([0.0, 0.0005]),
        ),
    )


class Script:
    """Plays events against ``policy``: the clock, the running passes and the outcomes seen.

    Attributes:
        now: the virtual time.
        admitted: the entries admitted, in order.
        running: the passes dispatched and not finished, in dispatch order (the test's
            ``step`` appends them); the first ``workers`` have begun, the rest are prefetched.
        outcomes: entry id -> ``cancelled``, ``done`` or what the test records.
    """

    def __init__(self, policy: Policy[int]) -> None:
        self.policy = policy
        self.now = 0.0
        self.admitted: list[Entry[int]] = []
        self.running: list[Batch[int]] = []
        self.outcomes: dict[int, str] = {}

    def play(
        self,
        script: list[Any],
        offer: Callable[[Offer], Entry[int] | None],
        step: Callable[[], None],
    ) -> None:
        """Play every event; ``offer`` admits (an entry) or counts a refusal (None)."""
        p = self.policy
        for ev in script:
            if isinstance(ev, Offer):
                self.now += ev.dt
                entry = offer(ev)
                if entry is not None:
                    self.admitted.append(entry)
            elif isinstance(ev, Cancel) and self.admitted:
                e = self.admitted[ev.pick % len(self.admitted)]
                if e.id not in self.outcomes and p.cancel(self.now, e):
                    self.outcomes[e.id] = "cancelled"
            elif isinstance(ev, Finish) and self.running:
                self.now += ev.dt
                # Only a pass that has begun can end: the first ``workers`` dispatched (the
                # rest are prefetched behind them).
                workers = p.config.workers
                prefetched = len(self.running) > workers
                b = self.running.pop(ev.pick % min(len(self.running), workers))
                skipped = [e for e in b.entries if e.withdrawn]
                live = [e for e in b.entries if not e.withdrawn]
                p.finish(self.now, b, failed=live[:1] if ev.fail_first else [], skipped=skipped)
                if prefetched:
                    assert self.running[workers - 1].start == self.now, "prefetched pass begins"
                self._done(b)
            elif isinstance(ev, Tick):
                self.now += ev.dt
            step()

    def drain(self, step: Callable[[], None], *, close: bool) -> None:
        """Run everything to the end (closing the policy first if ``close``)."""
        p = self.policy
        if close:
            p.close()
        for _ in range(1000):
            step()
            if self.running:
                b = self.running.pop(0)
                self.now += 0.001
                p.finish(self.now, b, skipped=[e for e in b.entries if e.withdrawn])
                self._done(b)
            elif p.idle:
                break
            else:
                self.now += 0.01
        assert p.idle
        assert set(self.outcomes) == {e.id for e in self.admitted}, "every admitted item resolved"

    def _done(self, batch: Batch[int]) -> None:
        for e in batch.entries:
            if self.outcomes.get(e.id) == "expired":
                # Its deadline passed while its batch was prefetched, its pass not begun.
                assert e.withdrawn
                continue
            assert e.id not in self.outcomes
            self.outcomes[e.id] = "done"
