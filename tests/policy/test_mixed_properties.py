"""Hypothesis: the mixed policy's invariants hold for every class and tenant."""

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import Rejected
from batchserve.policy import Batch, ClassConfig, Entry, MixedPolicy, Tenant, WorkClass


@dataclass
class Offer:
    dt: float
    timeout: float | None
    work_class: int
    tenant: int


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
            st.integers(0, 2),
            st.integers(0, 3),
        ),
        st.builds(Cancel, st.integers(0, 50)),
        st.builds(Finish, times, st.integers(0, 5), st.booleans()),
        st.builds(Tick, times),
    ),
    max_size=100,
)
configs = st.builds(
    BatchConfig,
    max_batch_size=st.integers(1, 6),
    max_wait_s=st.sampled_from([0.0, 0.001, 0.005]),
    queue_size=st.integers(1, 16),
    workers=st.integers(1, 3),
    admission=st.booleans(),
    initial_cost=st.builds(
        CostEstimate,
        fixed_s=st.sampled_from([0.0, 0.002]),
        per_item_s=st.sampled_from([0.0, 0.0005]),
    ),
)
work_classes = st.tuples(
    st.builds(
        WorkClass,
        name=st.just("interactive"),
        weight=st.sampled_from([0.5, 1.0, 4.0]),
        queue_share=st.sampled_from([0.25, 0.5, 1.0]),
        max_wait_s=st.sampled_from([None, 0.0, 0.003]),
    ),
    st.builds(
        WorkClass,
        name=st.just("bulk"),
        weight=st.sampled_from([0.25, 1.0]),
        queue_share=st.sampled_from([0.5, 0.75, 1.0]),
        max_wait_s=st.sampled_from([None, 0.01]),
    ),
    st.builds(WorkClass, name=st.just("batch"), weight=st.sampled_from([1.0, 2.0])),
)
class_configs = st.builds(
    ClassConfig,
    classes=work_classes,
    tenants=st.sampled_from([(), (Tenant(name="t1", weight=2.0), Tenant(name="t2"))]),
    tenant_share=st.sampled_from([0.5, 1.0]),
)
TENANTS = (None, "t1", "t2", "t3")
CLASS_NAMES = ("interactive", "bulk", "batch")


@settings(max_examples=200, deadline=None)
@given(configs, class_configs, events, st.booleans())
def test_invariants_hold_for_every_class(
    config: BatchConfig, classes: ClassConfig, script: list[object], close_at_end: bool
) -> None:
    p: MixedPolicy[int] = MixedPolicy(config, classes)
    waits = {
        c.name: config.max_wait_s if c.max_wait_s is None else c.max_wait_s for c in classes.classes
    }
    now = 0.0
    admitted: list[Entry[int]] = []
    klass: dict[int, str] = {}
    running: list[Batch[int]] = []
    outcomes: dict[int, str] = {}
    dispatched: set[int] = set()
    rejected: dict[str, int] = dict.fromkeys(CLASS_NAMES, 0)

    def step() -> None:
        s = p.poll(now)
        for e in s.expired:
            assert e.id not in outcomes
            assert e.deadline is not None
            assert e.deadline <= now
            outcomes[e.id] = "expired"
        for b in s.dispatch:
            assert 1 <= len(b.entries) <= config.max_batch_size
            for e in b.entries:
                assert e.id not in dispatched, "dispatched once"
                assert e.deadline is None or e.deadline > now, "never after its deadline"
                dispatched.add(e.id)
            running.append(b)
        assert len(running) <= config.workers
        if s.wake_at is not None:
            assert s.wake_at >= now
        if len(running) < config.workers:
            # A worker is free: nothing left queued has waited past its class's max wait,
            # and nothing queued has a deadline already passed (it was answered).
            for e in p.queued():
                assert e.arrival + waits[klass[e.id]] > now, "max wait of its class kept"
                assert e.deadline is None or e.deadline > now, "expired items answered"
        for e in p.queued():
            assert e.deadline is None or e.deadline > now, "nothing expires unanswered"

    for ev in script:
        if isinstance(ev, Offer):
            now += ev.dt
            work_class = CLASS_NAMES[ev.work_class]
            deadline = None if ev.timeout is None else now + ev.timeout
            try:
                entry = p.offer_to(now, len(admitted), deadline, work_class, TENANTS[ev.tenant])
            except Rejected:
                rejected[work_class] += 1
            else:
                admitted.append(entry)
                klass[entry.id] = work_class
        elif isinstance(ev, Cancel) and admitted:
            e = admitted[ev.pick % len(admitted)]
            if e.id not in outcomes and p.cancel(now, e):
                outcomes[e.id] = "cancelled"
        elif isinstance(ev, Finish) and running:
            now += ev.dt
            b = running.pop(ev.pick % len(running))
            skipped = [e for e in b.entries if e.withdrawn]
            live = [e for e in b.entries if not e.withdrawn]
            p.finish(now, b, failed=live[:1] if ev.fail_first else [], skipped=skipped)
            for e in b.entries:
                assert e.id not in outcomes
                outcomes[e.id] = "done"
        elif isinstance(ev, Tick):
            now += ev.dt
        step()
        _check_tallies(p, rejected)
        queued = {c: p.class_depth(c) for c in CLASS_NAMES}
        for c in classes.classes:
            assert queued[c.name] <= classes.class_cap(c, config.queue_size), "class share"

    if close_at_end:
        p.close()
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
    _check_tallies(p, rejected)
    by_class = p.class_statistics()
    for name in CLASS_NAMES:
        n = sum(1 for e in admitted if klass[e.id] == name)
        tallies = by_class[name].values()
        assert sum(t.pending for t in tallies) == 0
        assert sum(t.received for t in tallies) == n + rejected[name], name
    assert set(outcomes) == {e.id for e in admitted}, "every admitted item resolved"


def _check_tallies(p: MixedPolicy[int], rejected: dict[str, int]) -> None:
    total = p.statistics().counters
    assert total.received == total.resolved + total.pending
    by_class = p.class_statistics()
    received = 0
    for name, tenants in by_class.items():
        for t in tenants.values():
            assert t.received == t.resolved + t.pending, "outcomes add up per class and tenant"
            received += t.received
        assert sum(t.rejected_total for t in tenants.values()) == rejected[name]
    assert received == total.received
