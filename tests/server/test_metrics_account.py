"""The metrics' account of a model, read by Triton's statistics and the live status."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from batchserve.batcher import BatchRecord
from batchserve.server.account import Window, quantile
from batchserve.server.ops.metrics import Metrics


@given(
    size=st.integers(1, 9),
    chunks=st.lists(st.lists(st.floats(0, 1), max_size=30), max_size=8),
)
def test_the_window_holds_exactly_the_latest_values(size: int, chunks: list[list[float]]) -> None:
    window, seen = Window(size), []
    for chunk in chunks:
        window.extend(tuple(chunk))
        seen.extend(chunk)
        assert window.count == len(seen)
        assert sorted(window.latest()) == sorted(seen[-size:])
    window.add(2.0)
    assert 2.0 in window.latest()


def test_quantile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50.0
    assert quantile(values, 0.99) == 99.0
    assert quantile(values, 1.0) == 100.0
    assert quantile([3.0], 0.99) == 3.0
    assert quantile((), 0.5) is None


def record(batch_id: int, waits: tuple[float, ...], forward_s: float) -> BatchRecord:
    return BatchRecord(
        batch_id=batch_id,
        size=len(waits),
        forward_s=forward_s,
        queue_waits_s=waits,
        failed=0,
        skipped=0,
        bisect_calls=0,
    )


def test_account_adds_up_requests_and_passes() -> None:
    m = Metrics()
    m.add_model("a", lambda: None, lambda: True)
    m.add_model("b", lambda: None, lambda: True)
    for reason, seconds in (("ok", 0.5), ("ok", 0.25), ("queue_full", 0.001), ("malformed", 0.0)):
        m.observe_received()
        m.observe_request("a", "openai", reason, seconds)
    m.observe_received()
    m.observe_request("a", "kserve", "deadline_exceeded", 2.0, outcome="late")
    m.observe_batch("a", record(0, (0.1, 0.2), 1.0))
    m.observe_batch("a", record(1, (0.3,), 0.5))
    m.observe_batch("a", record(2, (0.0, 0.0), 2.0))
    a = m.account("a")
    assert a.requests == {
        ("ok", "ok"): 2,
        ("rejected", "queue_full"): 1,
        ("invalid", "malformed"): 1,
        ("late", "deadline_exceeded"): 1,
    }
    assert a.count("ok") == 2
    assert a.success_s == 0.75
    assert a.other_s == {"rejected": 0.001, "invalid": 0.0, "late": 2.0}
    assert (a.items, a.passes) == (5, 3)
    assert a.queue_wait_s == 0.6000000000000001
    assert a.forward_s == 3.5
    assert a.item_forward_s == 2 * 1.0 + 0.5 + 2 * 2.0
    assert a.by_size == {1: (1, 0.5), 2: (2, 3.0)}
    assert a.last_pass_unix is not None
    assert sorted(a.recent_forward_s) == [0.5, 1.0, 2.0]
    assert sorted(a.recent_queue_wait_s) == [0.0, 0.0, 0.1, 0.2, 0.3]
    b = m.account("b")
    assert (b.requests, b.items, b.passes, b.last_pass_unix) == ({}, 0, 0, None)
