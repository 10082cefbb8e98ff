"""Hypothesis: the policy's invariants hold for any sequence of events."""

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import Rejected
from batchserve.policy import Batch, Entry, Policy


@dataclass
class Offer:
    dt: float
    timeout: float | None


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
events = st.lists(
    st.one_of(
        st.builds(Offer, times, st.one_of(st.none(), st.floats(min_value=0.001, max_value=0.1))),
        st.builds(Cancel, st.integers(0, 50)),
        st.builds(Finish, times, st.integers(0, 5), st.booleans()),
        st.builds(Tick, times),
    ),
    max_size=120,
)
configs = st.builds(
    BatchConfig,
    max_batch_size=st.integers(1, 6),
    max_wait_s=st.sampled_from([0.0, 0.001, 0.005]),
    queue_size=st.integers(1, 12),
    workers=st.integers(1, 3),
    admission=st.booleans(),
    initial_cost=st.builds(
        CostEstimate,
        fixed_s=st.sampled_from([0.0, 0.002]),
        per_item_s=st.sampled_from([0.0, 0.0005]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(configs, events, st.booleans())
def test_invariants(config: BatchConfig, script: list[object], close_at_end: bool) -> None:
    p: Policy[int] = Policy(config)
    now = 0.0
    admitted: list[Entry[int]] = []
    running: list[Batch[int]] = []
    outcomes: dict[int, str] = {}
    dispatched: set[int] = set()
    rejected = 0

    def step() -> None:
        s = p.poll(now)
        for e in s.expired:
            assert e.id not in outcomes
            assert e.deadline is not None
            assert e.deadline <= now
            outcomes[e.id] = "expired"
        for b in s.dispatch:
            assert 1 <= len(b.entries) <= config.max_batch_size
            ids = [e.id for e in b.entries]
            assert ids == sorted(ids), "FIFO order within a batch"
            for e in b.entries:
                assert e.id not in dispatched, "dispatched once"
                assert e.deadline is None or e.deadline > now, "never after its deadline"
                dispatched.add(e.id)
            running.append(b)
        assert len(running) <= config.workers
        if s.wake_at is not None:
            assert s.wake_at >= now

    for ev in script:
        if isinstance(ev, Offer):
            now += ev.dt
            try:
                e = p.offer(now, len(admitted), None if ev.timeout is None else now + ev.timeout)
            except Rejected:
                rejected += 1
            else:
                admitted.append(e)
        elif isinstance(ev, Cancel) and admitted:
            e = admitted[ev.pick % len(admitted)]
            if e.id not in outcomes and p.cancel(now, e):
                outcomes[e.id] = "cancelled"
        elif isinstance(ev, Finish) and running:
            now += ev.dt
            b = running.pop(ev.pick % len(running))
            skipped = [e for e in b.entries if e.withdrawn]
            live = [e for e in b.entries if not e.withdrawn]
            failed = live[:1] if ev.fail_first else []
            p.finish(now, b, failed=failed, skipped=skipped)
            for e in b.entries:
                assert e.id not in outcomes
                outcomes[e.id] = "done"
        elif isinstance(ev, Tick):
            now += ev.dt
        step()
        c = p.statistics().counters
        assert c.received == c.resolved + c.pending
        assert c.rejected_total == rejected

    if close_at_end:
        p.close()
    # Drain: run everything to the end.
    for _ in range(1000):
        step()
        if running:
            b = running.pop(0)
            now += 0.001
            p.finish(now, b, skipped=[e for e in b.entries if e.withdrawn])
            for e in b.entries:
                outcomes[e.id] = "done"
        elif p.idle:
            break
        else:
            now += 0.01
    assert p.idle
    c = p.statistics().counters
    assert c.pending == 0
    assert c.received == c.resolved == len(admitted) + rejected
    assert set(outcomes) == {e.id for e in admitted}, "every admitted item resolved"
