"""Admission must not make the items already admitted late.

A new item joins the batch of the last queued items, and a bigger batch is a longer pass:
admitting it delays each of them by ``per_item_s``. Admission used to check only the new
item's own deadline, so under overload each batch was filled up past its first items'
deadlines: at 5x capacity over HTTP, 28% of the computed items came back 504 ``late``,
wasted passes that took goodput to about 60% of capacity. Now the new item is refused when
it would make an earlier item of its batch late. Plain numbers, no clock.
"""

from __future__ import annotations

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import DeadlineInfeasible
from batchserve.policy import Policy

pytestmark = pytest.mark.reliability

COST = CostEstimate(fixed_s=0.010, per_item_s=0.010)


def busy_policy() -> Policy[str]:
    """One worker, busy until 0.020 with a pass of one item started at 0."""
    p: Policy[str] = Policy(BatchConfig(max_batch_size=4, max_wait_s=0.0, initial_cost=COST))
    p.offer(0.0, "running")
    assert len(p.poll(0.0).dispatch) == 1
    return p


def test_an_item_that_would_make_its_batch_mate_late_is_refused() -> None:
    p = busy_policy()
    # Alone, "a" runs 0.020..0.040 (plus a 2% margin): its deadline 0.045 is met.
    p.offer(0.0, "a", deadline=0.045)
    # With "b" the pass is 0.020..0.050: "b" itself would be on time, "a" would not.
    with pytest.raises(DeadlineInfeasible, match="earlier item of its batch") as info:
        p.offer(0.0, "b", deadline=1.0)
    assert info.value.retry_after_s == pytest.approx(0.051 - 0.045, abs=1e-3)
    assert p.queue_depth == 1


def test_batch_mates_with_room_are_admitted() -> None:
    p = busy_policy()
    p.offer(0.0, "a", deadline=0.2)
    for x in "bcd":
        p.offer(0.0, x, deadline=0.2)  # a full batch ends at 0.070: all on time
    p.offer(0.0, "e", deadline=0.2)  # the next batch: 0.070..0.090
    assert p.queue_depth == 5


def test_items_without_deadlines_do_not_constrain_their_mates() -> None:
    p = busy_policy()
    p.offer(0.0, "a")
    p.offer(0.0, "b", deadline=0.1)
    assert p.queue_depth == 2
