"""Scenario 4: a forward pass that takes far longer than the deadlines, then recovers.

Steady load at 100 requests/s with 300 ms deadlines; at 1 s the model's passes get stuck
(a file flag) for 1.5 s, then it recovers. Tolerances: an answer may come 100 ms after its
deadline (two shared cores); admission may take up to 400 ms to see that the pass is stuck
and up to 1 s to trust the model fully again after it recovers (the one stuck pass
weighs on the cost model's error margin for some tens of passes; meanwhile an idle worker
takes each request that arrives as a probe, so service resumes at once, if not at full
rate).
"""

from __future__ import annotations

import pathlib

import pytest

from batchserve_testing.scenarios import stuck_model

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

MARGIN_S = 0.1


def test_stuck_pass_504s_at_the_deadline_refuses_then_recovers(tmp_path: pathlib.Path) -> None:
    f = stuck_model(tmp_path, stall_at_s=1.0, stall_s=1.5, after_s=2.0, deadline_s=0.3)
    run, counts = f.run, f.counts
    assert run is not None
    assert counts is not None
    start, end = f.extra["stall"]
    deadline = f.extra["deadline_s"]
    offsets = run.result.offsets
    summary = f"{f.extra['statuses']} {counts.row()}"

    def window(lo: float, hi: float) -> list[int]:
        return [i for i in range(run.n) if lo <= offsets[i] < hi]

    # Before the stall: served.
    before = window(0.2, start - 0.05)
    assert all(run.status[i] == 200 for i in before), summary
    # Callers caught by the stuck pass, or queued behind it, get 504 at their deadline,
    # not when the pass ends 1.5 s later.
    timed_out = run.indices(504)
    assert timed_out, summary
    assert all(start - 0.05 <= offsets[i] < start + 0.4 for i in timed_out), summary
    assert max(run.response_s(i) for i in timed_out) <= deadline + MARGIN_S, summary
    assert counts["late"] >= 1, summary  # some were in the stuck pass itself
    # Admission then stops taking what cannot be served: refusals, at once.
    during = window(start + 0.4, end)
    assert len(during) > 50
    assert all(run.status[i] == 429 for i in during), summary
    assert max(run.response_s(i) for i in during) < 0.05, summary
    # The model recovers and so does service, without a restart: at once in part, then
    # wholly.
    assert any(run.status[i] == 200 for i in window(end, end + 0.3)), summary
    after = window(end + 1.0, end + 2.0)
    assert len(after) > 50
    assert all(run.status[i] == 200 for i in after), summary
    # Nothing hung, nothing lost, the counters add up (checked by settled_counts).
    assert f.lost == 0, summary
    assert all(s in (200, 429, 504) for s in run.status), summary
    assert f.extra["healthy_after"]
