"""Hypothesis: the mixed policy's invariants hold for every class and tenant, by count or tokens."""

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from policy_script import Offer, Script, configs, events, timeouts, times

from batchserve.config import BatchConfig
from batchserve.errors import Rejected
from batchserve.policy import ClassConfig, Entry, Policy, Tenant, WorkClass

scripts = events(
    st.builds(Offer, times, timeouts, st.integers(1, 300), st.integers(0, 2), st.integers(0, 3)),
    max_size=100,
)
work_classes = st.tuples(
    st.builds(
        WorkClass,
        name=st.just("interactive"),
        weight=st.sampled_from([0.5, 1.0, 4.0]),
        queue_share=st.sampled_from([0.25, 0.5, 1.0]),
        max_wait_s=st.sampled_from([None, 0.0, 0.003]),
        reserve=st.sampled_from([0, 0, 1]),
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
@given(configs(max_queue=16), class_configs, scripts, st.booleans(), st.booleans())
def test_invariants_hold_for_every_class(
    config: BatchConfig,
    classes: ClassConfig,
    script: list[object],
    close_at_end: bool,
    by_tokens: bool,
) -> None:
    # By count or by tokens (each offer's size is read only by tokens): the same invariants.
    assume(classes.reserved < config.workers)  # else refused at once (tested on its own)
    p: Policy[int] = Policy(config, classes=classes, by_tokens=by_tokens)
    reserving = {c.name for c in classes.classes if c.reserve}
    waits = {
        c.name: config.max_wait_s if c.max_wait_s is None else c.max_wait_s for c in classes.classes
    }
    run = Script(p)
    klass: dict[int, str] = {}
    dispatched: set[int] = set()
    rejected: dict[str, int] = dict.fromkeys(CLASS_NAMES, 0)

    wake = math.inf  # when the driver's timer would poll next
    offered = False  # the last event was an offer

    def step() -> None:
        nonlocal wake, offered
        now = run.now
        skip = offered and now < wake and not p.poll_due(now, wake)
        offered = False
        s = p.poll(now)
        if skip:  # the driver skips this poll after an offer: there was nothing to do
            assert not s.expired
            assert not s.dispatch
            assert not s.late
            assert s.wake_at is None or s.wake_at >= wake
        wake = math.inf if s.wake_at is None else s.wake_at
        for e in s.expired:
            assert e.id not in run.outcomes
            assert e.deadline is not None
            assert e.deadline <= now
            run.outcomes[e.id] = "expired"
        for b in s.dispatch:
            assert 1 <= len(b.entries) <= config.max_batch_size
            kept = {klass[e.id] in reserving for e in b.entries}
            assert len(kept) == 1, "a reserving class's items ride passes of their own"
            for e in b.entries:
                assert e.id not in dispatched, "dispatched once"
                assert e.deadline is None or e.deadline > now, "never after its deadline"
                dispatched.add(e.id)
            run.running.append(b)
        assert len(run.running) <= config.workers
        if s.wake_at is not None:
            assert s.wake_at >= now
        others = sum(1 for b in run.running if klass[b.entries[0].id] not in reserving)
        if len(run.running) < config.workers:
            # A worker is free for its class (the others' passes leave the reserve free):
            # nothing left queued has waited past its class's max wait, and nothing queued
            # has a deadline already passed (it was answered).
            free_for_others = others < config.workers - classes.reserved
            for e in p.queued():
                if klass[e.id] in reserving or free_for_others:
                    assert e.arrival + waits[klass[e.id]] > now, "max wait of its class kept"
                assert e.deadline is None or e.deadline > now, "expired items answered"
        for e in p.queued():
            assert e.deadline is None or e.deadline > now, "nothing expires unanswered"

    def step_and_check() -> None:
        step()
        _check_tallies(p, rejected)
        queued = p.class_depths()
        for c in classes.classes:
            assert queued[c.name] <= classes.class_cap(c, config.queue_size), "class share"

    def offer(ev: Offer) -> Entry[int] | None:
        nonlocal offered
        offered = True
        work_class = CLASS_NAMES[ev.work_class]
        deadline = None if ev.timeout is None else run.now + ev.timeout
        try:
            entry = p.offer(
                run.now,
                len(run.admitted),
                deadline,
                ev.size,
                work_class=work_class,
                tenant=TENANTS[ev.tenant],
            )
        except Rejected:
            rejected[work_class] += 1
            return None
        klass[entry.id] = work_class
        return entry

    run.play(script, offer, step_and_check)
    run.drain(step, close=close_at_end)
    _check_tallies(p, rejected)
    by_class = p.class_statistics()
    for name in CLASS_NAMES:
        n = sum(1 for e in run.admitted if klass[e.id] == name)
        tallies = by_class[name].values()
        assert sum(t.pending for t in tallies) == 0
        assert sum(t.received for t in tallies) == n + rejected[name], name


def _check_tallies(p: Policy[int], rejected: dict[str, int]) -> None:
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
