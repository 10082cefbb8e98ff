"""Prefetch: while every worker is busy, a full batch is handed over to begin next."""

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.policy import Policy

COST = CostEstimate(fixed_s=0.008, per_item_s=0.001)


def make(**kw: object) -> Policy[str]:
    return Policy(BatchConfig(initial_cost=COST, **kw))  # type: ignore[arg-type]


def payloads(batches: list) -> list[list[str]]:  # type: ignore[type-arg]
    return [[e.payload for e in b.entries] for b in batches]


def test_a_full_batch_is_prefetched_one_per_worker_and_a_partial_one_waits() -> None:
    p = make(max_batch_size=2, max_wait_s=0.0)
    for x in "abcdefg":
        p.offer(0.0, x)
    # One running, one prefetched; the third full batch waits for a worker.
    assert payloads(p.poll(0.0).dispatch) == [["a", "b"], ["c", "d"]]
    assert p.poll(0.001).dispatch == []
    assert p.statistics().running_batches == 2


def test_a_batch_that_can_still_grow_is_not_prefetched() -> None:
    p = make(max_batch_size=4, max_wait_s=0.0)
    for x in "abcde":
        p.offer(0.0, x)
    running = p.poll(0.0).dispatch
    assert payloads(running) == [["a", "b", "c", "d"]]
    # "e" is past its max wait, but its batch is not full: it keeps the seats free for
    # what arrives while the pass runs.
    assert p.poll(0.005).dispatch == []
    assert not p.poll_due(0.005, 1.0)
    for x in "fgh":
        p.offer(0.006, x)
    assert p.poll_due(0.006, 1.0)
    assert payloads(p.poll(0.006).dispatch) == [["e", "f", "g", "h"]]


def test_queued_lists_prefetched_entries_first_when_asked_and_never_running_ones() -> None:
    p = make(max_batch_size=2, max_wait_s=0.0)
    for x in "abcde":
        p.offer(0.0, x)
    first, second = p.poll(0.0).dispatch
    assert [e.payload for e in p.queued()] == ["e"]
    assert [e.payload for e in p.queued(prefetched=True)] == ["c", "d", "e"]
    p.cancel(0.001, second.entries[0])  # withdrawn: its pass will skip it
    assert [e.payload for e in p.queued(prefetched=True)] == ["d", "e"]
    p.finish(0.010, first)  # the prefetched pass begins: its entries run now
    assert [e.payload for e in p.queued(prefetched=True)] == ["e"]


def test_draining_prefetches_what_is_left_since_nothing_more_joins_it() -> None:
    p = make(max_batch_size=4, max_wait_s=1.0)
    for x in "abcde":
        p.offer(0.0, x)
    p.poll(0.0)
    p.close()
    assert payloads(p.poll(0.001).dispatch) == [["e"]]


def test_finish_begins_the_prefetched_pass_and_the_cost_model_times_it_from_then() -> None:
    p = make(max_batch_size=2, max_wait_s=0.0)
    for x in "abcd":
        p.offer(0.0, x)
    first, second = p.poll(0.0).dispatch
    assert second.start == 0.0  # dispatched, not begun
    p.finish(0.010, first)
    assert second.start == 0.010
    p.finish(0.020, second)
    assert p.cost_model.samples == 2
    # Both passes were observed at 10 ms, not the second at the 20 ms since its dispatch.
    assert p.cost_model.cost(2) == pytest.approx(0.010, abs=1e-6)


def test_with_two_workers_the_first_to_finish_begins_the_oldest_prefetched_pass() -> None:
    p = make(max_batch_size=1, max_wait_s=0.0, workers=2)
    for x in "abcd":
        p.offer(0.0, x)
    a, b, c, d = p.poll(0.0).dispatch
    p.finish(0.004, b)
    assert (c.start, d.start) == (0.004, 0.0)
    p.finish(0.006, a)
    assert d.start == 0.006


def test_admission_predicts_a_prefetched_pass_as_the_one_after_the_running_pass() -> None:
    # The same queue, prefetched or not: the item offered next is predicted to finish at
    # the same time, after the running pass and the full batch behind it.
    with_ = make(max_batch_size=2, max_wait_s=0.0)
    without = make(max_batch_size=2, max_wait_s=0.0, prefetch=False)
    for p in (with_, without):
        for x in "abcd":
            p.offer(0.0, x)
    assert len(with_.poll(0.0).dispatch) == 2
    assert len(without.poll(0.0).dispatch) == 1
    # The running pass ends at 0.010, the next at 0.020; the next item's, behind a full
    # batch and so predicted full itself, at 0.030.
    assert with_.predict_finish(0.002) == pytest.approx(0.030)
    assert without.predict_finish(0.002) == pytest.approx(0.030)


def test_a_prefetched_item_whose_caller_left_is_marked_for_the_driver_to_skip() -> None:
    p = make(max_batch_size=2, max_wait_s=0.0)
    for x in "abcd":
        p.offer(0.0, x)
    first, second = p.poll(0.0).dispatch
    left = second.entries[0]
    assert not p.cancel(0.001, left)  # dispatched: only marked
    assert left.withdrawn
    p.finish(0.010, first)
    p.finish(0.019, second, skipped=[left])
    counters = p.statistics().counters
    assert (counters.ok, counters.cancelled, counters.pending) == (3, 1, 0)


def test_a_prefetched_item_whose_deadline_passes_before_its_pass_expires() -> None:
    p = make(max_batch_size=1, max_wait_s=0.0, admission=False)
    p.offer(0.0, "running", deadline=1.0)
    p.offer(0.0, "waiting", deadline=0.005)
    first, second = p.poll(0.0).dispatch
    step = p.poll(0.005)
    # Its pass has not begun: it expires as in the queue (not "late", which is for a pass
    # under way), and the driver skips it when the pass begins.
    assert [e.payload for e in step.expired] == ["waiting"]
    assert step.late == []
    assert second.entries[0].withdrawn
    p.finish(0.010, first)
    p.finish(0.010, second, skipped=second.entries)
    counters = p.statistics().counters
    assert (counters.ok, counters.expired, counters.cancelled, counters.pending) == (1, 1, 0, 0)


def test_once_its_pass_has_begun_a_prefetched_item_is_late_not_expired() -> None:
    p = make(max_batch_size=1, max_wait_s=0.0, admission=False)
    p.offer(0.0, "running", deadline=1.0)
    p.offer(0.0, "next", deadline=0.015)
    first, _ = p.poll(0.0).dispatch
    p.finish(0.010, first)
    step = p.poll(0.015)
    assert step.expired == []
    assert [e.payload for e in step.late] == ["next"]


def test_the_mixed_policy_never_prefetches() -> None:
    from batchserve.policy import ClassConfig, WorkClass

    classes = ClassConfig(classes=(WorkClass(name="interactive"), WorkClass(name="batch")))
    p = Policy[str](BatchConfig(max_batch_size=1, max_wait_s=0.0), classes=classes)
    for x in "ab":
        p.offer(0.0, x, None, work_class="batch")
    assert len(p.poll(0.0).dispatch) == 1
