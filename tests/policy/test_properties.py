"""Hypothesis: the policy's invariants hold for any sequence of events, by count or by tokens."""

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import Rejected
from batchserve.policy import Batch, Entry, Policy, TokenPolicy


@dataclass
class Offer:
    dt: float
    timeout: float | None
    size: int


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
        st.builds(
            Offer,
            times,
            st.one_of(st.none(), st.floats(min_value=0.001, max_value=0.1)),
            st.integers(1, 300),
        ),
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


# Passes by tokens: None (by count), or (max_batch_tokens or None, length_window).
by_tokens = st.one_of(
    st.none(), st.tuples(st.one_of(st.none(), st.integers(50, 600)), st.integers(1, 3))
)


@settings(max_examples=300, deadline=None)
@given(configs, events, st.booleans(), by_tokens)
def test_invariants(
    config: BatchConfig,
    script: list[object],
    close_at_end: bool,
    tokens: tuple[int | None, int] | None,
) -> None:
    p: Policy[int]
    if tokens is None:
        p = Policy(config)
    else:
        config = replace(config, max_batch_tokens=tokens[0], length_window=tokens[1])
        p = TokenPolicy(config)
    limit = config.max_batch_tokens
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
            assert ids == sorted(ids), "queue order within a batch"
            if limit is not None and len(b.entries) > 1:
                padded = max(e.size for e in b.entries) * len(b.entries)
                assert padded <= limit, "a pass of several items within max_batch_tokens"
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
                deadline = None if ev.timeout is None else now + ev.timeout
                e = p.offer(now, len(admitted), deadline, ev.size)
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
        stats = p.statistics()
        c = stats.counters
        assert c.received == c.resolved + c.pending
        assert c.rejected_total == rejected
        if stats.tokens is not None:
            assert stats.tokens.queued == sum(e.size for e in p.queued())
            assert stats.tokens.padded >= stats.tokens.real

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
