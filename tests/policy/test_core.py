"""The pure policy, driven with plain numbers: no event loop, no sleeps."""

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import DeadlineInfeasible, QueueFull, ShuttingDown
from batchserve.policy import Policy


def make(**kw: object) -> Policy[str]:
    return Policy(BatchConfig(**kw))  # type: ignore[arg-type]


def test_single_item_waits_max_wait_then_dispatches() -> None:
    p = make(max_batch_size=4, max_wait_s=0.002)
    p.offer(10.0, "a")
    step = p.poll(10.0)
    assert step.dispatch == []
    assert step.wake_at == pytest.approx(10.002)
    step = p.poll(10.002)
    assert [[e.payload for e in b.entries] for b in step.dispatch] == [["a"]]
    assert step.dispatch[0].start == 10.002


def test_full_batch_dispatches_at_once_without_waiting() -> None:
    p = make(max_batch_size=3, max_wait_s=1.0)
    for x in "abcd":
        p.offer(0.0, x)
    step = p.poll(0.0)
    assert [[e.payload for e in b.entries] for b in step.dispatch] == [["a", "b", "c"]]
    # Only one worker: "d" waits for it even though its max wait will pass.
    assert p.poll(5.0).dispatch == []
    p.finish(5.0, step.dispatch[0])
    assert [e.payload for e in p.poll(5.0).dispatch[0].entries] == ["d"]


def test_max_wait_counts_from_oldest_item_not_from_worker_free() -> None:
    p = make(max_batch_size=8, max_wait_s=0.010)
    p.offer(0.0, "first")
    p.offer(0.004, "second")
    assert p.poll(0.004).wake_at == pytest.approx(0.010)
    batch = p.poll(0.010).dispatch[0]
    assert [e.payload for e in batch.entries] == ["first", "second"]


def test_no_dispatch_while_all_workers_busy_and_two_workers_run_two_batches() -> None:
    p = make(max_batch_size=1, max_wait_s=0.0, workers=2, prefetch=False)
    for x in "abc":
        p.offer(0.0, x)
    step = p.poll(0.0)
    assert [b.entries[0].payload for b in step.dispatch] == ["a", "b"]
    assert step.wake_at is None
    p.finish(1.0, step.dispatch[1])
    assert [b.entries[0].payload for b in p.poll(1.0).dispatch] == ["c"]


def test_queue_full_is_refused_at_once() -> None:
    p = make(queue_size=2, max_batch_size=10, max_wait_s=1.0)
    p.offer(0.0, "a")
    p.offer(0.0, "b")
    with pytest.raises(QueueFull, match="queue_size is 2") as info:
        p.offer(0.0, "c")
    assert info.value.reason == "queue_full"
    assert info.value.retry_after_s > 0
    assert p.statistics().counters.rejected["queue_full"] == 1


def test_expiry_happens_at_the_deadline_and_the_slot_goes_to_the_next_item() -> None:
    p = make(max_batch_size=2, max_wait_s=0.05, admission=False)
    p.offer(0.0, "doomed", deadline=0.01)
    p.offer(0.0, "x")
    p.offer(0.0, "y")
    # The full batch goes at once; "x" and "y" are behind "doomed" only if it were alive.
    step = p.poll(0.0)
    assert [e.payload for e in step.dispatch[0].entries] == ["doomed", "x"]
    p2 = make(max_batch_size=3, max_wait_s=0.05, admission=False)
    p2.offer(0.0, "doomed", deadline=0.01)
    p2.offer(0.0, "x")
    step = p2.poll(0.0)
    assert step.wake_at == 0.01
    step = p2.poll(0.01)
    assert [e.payload for e in step.expired] == ["doomed"]
    assert step.wake_at == pytest.approx(0.05)
    p2.offer(0.02, "z")
    step = p2.poll(0.05)
    assert [e.payload for e in step.dispatch[0].entries] == ["x", "z"]
    assert p2.statistics().counters.expired == 1


def test_infeasible_deadline_is_refused_at_once() -> None:
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.0)
    p = make(max_batch_size=1, max_wait_s=0.0, initial_cost=cost)
    # Each pass takes 10 ms; with a 25 ms deadline the third queued item cannot make it.
    p.offer(0.0, "a", deadline=0.025)
    p.offer(0.0, "b", deadline=0.025)
    with pytest.raises(DeadlineInfeasible) as info:
        p.offer(0.0, "c", deadline=0.025)
    assert info.value.reason == "infeasible"
    assert info.value.retry_after_s == pytest.approx(0.005, abs=1e-3)


def test_a_new_item_may_not_make_an_earlier_item_of_its_batch_late() -> None:
    # A pass costs 10 ms + 10 ms per item; batches of 4; the worker is free.
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.010)
    p = make(max_batch_size=4, max_wait_s=0.0, initial_cost=cost)
    a = p.offer(0.0, "a", deadline=1.0)
    p.offer(0.0, "tight", deadline=0.031)  # its pass of 2 ends at 30 ms: admitted
    # A third item would make that pass end at 40 ms, after "tight"'s deadline.
    with pytest.raises(DeadlineInfeasible, match="an earlier item of its batch"):
        p.offer(0.0, "c", deadline=1.0)
    assert p.screen(0.0, 1.0) is not None  # the same answer from the head alone
    # With "a" gone, "tight" is alone in the batch and a newcomer fits beside it.
    p.cancel(0.0, a)
    p.offer(0.0, "d", deadline=1.0)
    assert [e.payload for e in p.queued()] == ["tight", "d"]
    counters = p.statistics().counters
    assert (counters.received, counters.rejected["infeasible"]) == (5, 2)


def test_admission_off_admits_what_would_be_late() -> None:
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.0)
    p = make(max_batch_size=1, max_wait_s=0.0, initial_cost=cost, admission=False)
    for x in "abc":
        p.offer(0.0, x, deadline=0.025)
    assert p.queue_depth == 3


def test_past_deadline_is_refused_even_without_admission() -> None:
    p = make(admission=False)
    with pytest.raises(DeadlineInfeasible):
        p.offer(1.0, "late", deadline=1.0)


def test_cancel_queued_and_running() -> None:
    p = make(max_batch_size=2, max_wait_s=0.0)
    a = p.offer(0.0, "a")
    b = p.offer(0.0, "b")
    c = p.offer(0.0, "c")
    assert p.cancel(0.0, c) is True
    batch = p.poll(0.0).dispatch[0]
    assert p.cancel(0.0, a) is False
    assert a.withdrawn
    p.finish(0.1, batch, skipped=[a])
    counters = p.statistics().counters
    assert (counters.cancelled, counters.ok) == (2, 1)
    assert b.state == 2


def test_close_refuses_new_and_dispatches_queued_without_waiting() -> None:
    p = make(max_batch_size=8, max_wait_s=10.0)
    p.offer(0.0, "a")
    p.close()
    with pytest.raises(ShuttingDown):
        p.offer(0.0, "b")
    assert [e.payload for e in p.poll(0.0).dispatch[0].entries] == ["a"]


def test_outcomes_late_failed_and_counters_add_up() -> None:
    p = make(max_batch_size=3, max_wait_s=0.0, admission=False)
    ok = p.offer(0.0, "ok", deadline=1.0)
    late = p.offer(0.0, "late", deadline=0.5)
    bad = p.offer(0.0, "bad")
    batch = p.poll(0.0).dispatch[0]
    p.finish(0.7, batch, failed=[bad])
    c = p.statistics().counters
    assert (c.ok, c.late, c.failed, c.pending) == (1, 1, 1, 0)
    assert c.received == c.resolved == 3
    assert ok.state == late.state == 2


def test_cost_model_learns_from_finished_batches() -> None:
    p = make(max_batch_size=4, max_wait_s=0.0)
    t = 0.0
    for n in (1, 2, 3, 4, 1, 4):
        for _ in range(n):
            p.offer(t, "x")
        batch = p.poll(t).dispatch[0]
        t += 0.008 + n * 0.001
        p.finish(t, batch)
    est = p.statistics().cost
    assert est.fixed_s == pytest.approx(0.008, rel=1e-6)
    assert est.per_item_s == pytest.approx(0.001, rel=1e-6)


def test_failed_batch_does_not_teach_the_cost_model() -> None:
    p = make(max_batch_size=1, max_wait_s=0.0)
    e = p.offer(0.0, "x")
    batch = p.poll(0.0).dispatch[0]
    p.finish(5.0, batch, failed=[e])
    assert p.statistics().cost_samples == 0


def test_finish_twice_is_an_error() -> None:
    p = make(max_batch_size=1, max_wait_s=0.0)
    p.offer(0.0, "x")
    batch = p.poll(0.0).dispatch[0]
    p.finish(0.1, batch)
    with pytest.raises(ValueError, match="not running"):
        p.finish(0.2, batch)


def test_stuck_pass_makes_admission_stricter() -> None:
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.0)
    p = make(max_batch_size=1, max_wait_s=0.0, initial_cost=cost)
    p.offer(0.0, "a")
    p.poll(0.0)
    # The pass was predicted to end at 0.010; at 1.0 it is still running, so it is assumed
    # to need as long again: an item due at 1.5 is refused, one due at 3.0 admitted.
    with pytest.raises(DeadlineInfeasible):
        p.offer(1.0, "b", deadline=1.5)
    p.offer(1.0, "c", deadline=3.0)


def test_retry_after_reflects_queue_and_drain_rate() -> None:
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.0)
    p = make(max_batch_size=2, max_wait_s=1.0, queue_size=4, initial_cost=cost)
    for _ in range(4):
        p.offer(0.0, "x")
    # Drain rate: 2 items per 10 ms. Clearing one batch (2 items) takes 10 ms.
    assert p.retry_after(0.0, "queue_full") == pytest.approx(0.010)
    assert p.retry_after(0.0, "draining") == pytest.approx(0.020)


def test_a_deadline_that_passes_during_a_pass_is_reported_at_the_deadline() -> None:
    p = make(max_batch_size=2, max_wait_s=0.0, admission=False)
    a = p.offer(0.0, "a", deadline=0.5)
    p.offer(0.0, "b", deadline=2.0)
    step = p.poll(0.0)
    (batch,) = step.dispatch
    assert [e.payload for e in batch.entries] == ["a", "b"]
    assert step.wake_at == 0.5  # the earliest running deadline
    assert p.poll(0.25).late == []
    step = p.poll(0.5)
    assert step.late == [a]
    assert a.withdrawn  # a pass that has not begun skips it
    assert step.wake_at == 2.0
    assert p.poll(0.75).late == []  # reported once
    p.finish(1.0, batch)
    counters = p.statistics().counters
    assert (counters.late, counters.ok) == (1, 1)
    assert p.poll(1.0).wake_at is None


class CountingPolicy(Policy[str]):
    """Counts admission's predictions."""

    predictions = 0

    def predict_finish(self, now: float) -> float:
        self.predictions += 1
        return super().predict_finish(now)


def counting(**kw: object) -> CountingPolicy:
    return CountingPolicy(BatchConfig(**kw))  # type: ignore[arg-type]


def test_offer_after_a_passed_screen_predicts_no_more() -> None:
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.001)
    p = counting(max_batch_size=4, max_wait_s=0.002, initial_cost=cost)
    assert p.screen(0.0, 1.0) is None
    p.offer(0.0001, "a", deadline=1.0)  # its head's verdict stands: predicted once
    assert p.predictions == 1
    # Another event since the screen (the offer itself): the next offer predicts again.
    p.offer(0.0002, "b", deadline=1.0)
    assert p.predictions == 2
    # A different deadline than the screen's is predicted again.
    assert p.screen(0.0003, 1.0) is None
    p.offer(0.0003, "c", deadline=0.9)
    assert p.predictions == 4
    assert p.statistics().counters.received == 3


def test_a_screen_is_not_reused_past_its_slack_or_after_a_change() -> None:
    cost = CostEstimate(fixed_s=0.010, per_item_s=0.0)
    p = counting(max_batch_size=1, max_wait_s=0.0, initial_cost=cost)
    # Alone, the item would finish at 10 ms: 5 ms of slack before its 15 ms deadline.
    assert p.screen(0.0, 0.015) is None
    # 6 ms later the same prediction says 16 ms: late. The screen's verdict is not reused.
    with pytest.raises(DeadlineInfeasible):
        p.offer(0.006, "late", deadline=0.015)
    assert p.predictions == 2
    # A change between screen and offer (another item admitted) is seen by the offer.
    assert p.screen(0.0, 0.015) is None
    p.offer(0.0, "first", deadline=1.0)
    with pytest.raises(DeadlineInfeasible):
        p.offer(0.0, "second", deadline=0.015)  # behind "first": 20 ms
    counters = p.statistics().counters
    assert (counters.received, counters.rejected["infeasible"]) == (3, 2)


def test_a_probe_screen_is_reused_only_at_the_same_instant() -> None:
    # Admitted as a probe (nothing queued, a worker idle, a measured model predicting late),
    # not by a prediction that fits: there is no slack to carry to a later offer.
    p = counting(max_batch_size=1, max_wait_s=0.0)
    p.cost_model.observe(1, 1.0)
    assert p.screen(0.0, 0.5) is None
    p.offer(0.0, "probe", deadline=0.5)
    assert p.predictions == 1
    assert p.screen(0.0, 0.5) is not None  # a second one is not a probe (the first queued)
