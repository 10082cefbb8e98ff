"""Admission must not lock itself out after a stuck or slow spell of the model.

Deadline-aware admission refuses what the cost model predicts cannot finish in time. After
one stuck pass the cost model's estimate and its error margin are huge, so every request
is refused; with nothing admitted nothing is measured, and the belief never heals: the
server refused everything until restarted. Now, when a worker is free and nothing is
queued, a request the belief would refuse is admitted as a probe (the worker was idle
anyway), and its pass refreshes the belief. A cost stated up front and never measured is
still trusted. Plain numbers, no clock.
"""

from __future__ import annotations

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import DeadlineInfeasible
from batchserve.policy import Policy

pytestmark = pytest.mark.reliability

COST = CostEstimate(fixed_s=0.005, per_item_s=0.0005)


def serve_one(p: Policy[str], now: float, took_s: float, deadline_s: float = 0.3) -> None:
    """Offer one item at ``now``, dispatch it, finish its pass ``took_s`` later."""
    p.offer(now, "x", deadline=now + deadline_s)
    (batch,) = p.poll(now).dispatch
    p.finish(now + took_s, batch)


def test_after_a_stuck_pass_an_idle_server_admits_again_and_relearns() -> None:
    p: Policy[str] = Policy(BatchConfig(max_batch_size=16, max_wait_s=0.0, initial_cost=COST))
    t = 0.0
    for _ in range(50):
        serve_one(p, t, 0.0055)
        t += 0.01
    # One pass stuck for 1.5 s: every item behind it is refused, as it should be.
    p.offer(t, "stuck", deadline=t + 0.3)
    (stuck,) = p.poll(t).dispatch
    with pytest.raises(DeadlineInfeasible):
        p.offer(t + 1.0, "behind", deadline=t + 1.3)
    t += 1.5
    p.finish(t, stuck)
    # The model has recovered. The belief still says no, but the worker is idle: the next
    # request goes through and is measured, and soon the belief admits on its own again.
    assert p.cost_model.spread_s > 0.1  # so the margin alone exceeds a 0.3 s deadline
    for _ in range(300):
        t += 0.01
        serve_one(p, t, 0.0055)
    c = p.statistics().counters
    assert c.rejected["infeasible"] == 1
    assert c.ok == 350
    # Healed: with a worker busy (no probe possible), a queue of 15 is admitted on belief.
    p.offer(t, "busy", deadline=t + 0.3)
    p.poll(t)
    for _ in range(15):
        p.offer(t, "queued", deadline=t + 0.3)
    assert p.queue_depth == 15
    assert p.statistics().counters.rejected["infeasible"] == 1


def test_a_probe_is_only_taken_when_a_worker_is_idle_and_nothing_waits() -> None:
    p: Policy[str] = Policy(BatchConfig(max_batch_size=1, max_wait_s=0.0, initial_cost=COST))
    serve_one(p, 0.0, 2.0, deadline_s=5.0)  # learned: a pass takes 2 s
    p.offer(3.0, "probe", deadline=3.1)  # idle: admitted although it will be late
    with pytest.raises(DeadlineInfeasible):
        p.offer(3.0, "second", deadline=3.1)  # the probe waits: no more on a bad belief
    assert len(p.poll(3.0).dispatch) == 1
    with pytest.raises(DeadlineInfeasible):
        p.offer(3.5, "while it runs", deadline=3.6)


def test_a_stated_cost_is_trusted_until_measured() -> None:
    slow = CostEstimate(fixed_s=1.0, per_item_s=0.0)
    p: Policy[str] = Policy(BatchConfig(max_wait_s=0.0, initial_cost=slow))
    with pytest.raises(DeadlineInfeasible):
        p.offer(0.0, "x", deadline=0.01)
    assert p.statistics().counters.received == 1


def test_a_request_of_several_items_rides_whole_on_the_probe() -> None:
    # The belief says a pass takes 3 s; the deadlines are 2 s. A request of 32 items at an
    # idle server: its first item is the probe, and the 31 behind it join the probe's pass
    # (it starts on the idle worker at once). Refusing them would refuse the request,
    # withdraw its first item, and leave nothing to correct the belief: every request of
    # more than one item would be refused for ever.
    p: Policy[str] = Policy(BatchConfig(max_batch_size=32, max_wait_s=0.0, initial_cost=COST))
    serve_one(p, 0.0, 3.0, deadline_s=5.0)  # learned: a pass takes 3 s
    for i in range(32):
        p.offer(10.0, f"item {i}", deadline=12.0)
    with pytest.raises(DeadlineInfeasible):
        p.offer(10.0, "one more", deadline=12.0)  # beyond one pass: not the probe's
    (batch,) = p.poll(10.0).dispatch
    assert len(batch.entries) == 32
    with pytest.raises(DeadlineInfeasible):
        p.offer(10.0, "while it runs", deadline=12.0)  # no worker idle: no probe
    p.finish(10.03, batch)  # the model is fast again: 30 ms, and the belief learns it
    for t in (11.0, 12.0, 13.0):
        for i in range(32):
            p.offer(t, f"later {i}", deadline=t + 2.0)
        (batch,) = p.poll(t).dispatch
        p.finish(t + 0.03, batch)
    assert p.cost_model.estimate.fixed_s + 32 * p.cost_model.estimate.per_item_s < 2.0


def test_behind_a_head_admitted_on_its_prediction_no_item_is_a_probe() -> None:
    # The head of the queue fits its (later) deadline; an item that would make the pass
    # late is refused as before: it does not ride on a probe, there is none.
    p: Policy[str] = Policy(BatchConfig(max_batch_size=32, max_wait_s=0.0, initial_cost=COST))
    serve_one(p, 0.0, 3.0, deadline_s=5.0)
    p.offer(10.0, "fits", deadline=20.0)
    with pytest.raises(DeadlineInfeasible):
        p.offer(10.0, "late", deadline=12.0)
    # A screen that admitted a probe which never came does not make the next head one.
    q: Policy[str] = Policy(BatchConfig(max_batch_size=32, max_wait_s=0.0, initial_cost=COST))
    serve_one(q, 0.0, 3.0, deadline_s=5.0)
    assert q.screen(10.0, 12.0) is None  # a probe, were it offered
    q.offer(10.0, "fits", deadline=20.0)
    with pytest.raises(DeadlineInfeasible):
        q.offer(10.0, "late", deadline=12.0)
