"""Scenario 6: SIGTERM in the middle of steady load, then a second SIGTERM.

200 requests/s with 20 s deadlines; SIGTERM at 1.5 s, and the model stuck from 0.3 s before
it (so that work is queued when it comes) to 6 s after it, so the drain lasts longer than
uvicorn's own 5 s of graceful shutdown (which alone would drop what is still queued). Every
request accepted before the signal is answered 200 (the model saw exactly the requests
answered 200), those after it get 503 ``draining`` while the drain lasts or, once the
listener has closed, a refused connection, and the process exits 0 within its 10 s drain
timeout. With the model stuck, a second SIGTERM 0.5 s after the first stops it at once
(within 1 s, not after the drain timeout) with a non-zero status, and it says so. Tolerance:
the signal is asynchronous, so which side of it a request falls on is only known to 50 ms.
"""

from __future__ import annotations

import pathlib

import pytest

from batchserve_testing.scenarios import REFUSED_CONNECTION, shutdown_under_load

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

EDGE_S = 0.05


def test_sigterm_under_load_answers_everything_accepted(tmp_path: pathlib.Path) -> None:
    f = shutdown_under_load(
        tmp_path, duration_s=8.5, signal_at_s=1.5, drain_timeout_s=10.0, drain_stall_s=6.0
    )
    run = f.run
    assert run is not None
    summary = (
        f"{f.extra['statuses']} exit {f.extra['exit_status']} after {f.extra['exit_after_s']:.2f} s"
    )
    assert f.extra["exit_status"] == 0, summary + f.extra["stderr"]
    assert 6.0 <= f.extra["exit_after_s"] < 10.0, summary
    assert "draining" in f.extra["stderr"]
    signal_at = f.extra["signal_offset_s"]
    offsets = run.result.offsets
    before = [i for i in range(run.n) if offsets[i] < signal_at - EDGE_S]
    after = [i for i in range(run.n) if offsets[i] > signal_at + EDGE_S]
    # Before the signal: every request answered, 200.
    assert len(before) > 250
    assert [i for i in before if run.status[i] != 200] == [], summary
    # After it: refused while the drain lasts (503 draining), then turned away at the door
    # once the listener has closed (a refused or reset connection: never read).
    refused = [i for i in after if run.status[i] == 503]
    assert all(run.reason(i) == "draining" for i in refused), summary
    assert len(refused) > 500, summary  # 6 s of drain at 200/s: refused, not turned away
    turned_away = [i for i in after if run.status[i] == 0]
    assert all(
        run.reason(i).startswith(REFUSED_CONNECTION) or run.reason(i) == "connection_lost"
        for i in turned_away
    ), summary
    assert len(refused) + len(turned_away) == len(after), summary
    # No request, on either side of the signal, got anything else.
    assert set(run.status) <= {0, 200, 503}, summary
    # Every accepted request reached the model and was answered: the model computed
    # exactly the texts of the 200s, so nothing it accepted was dropped.
    ok = run.indices(200)
    assert sorted(f.extra["computed"]) == sorted(run.text(i) for i in ok)


def test_a_second_sigterm_stops_at_once_and_says_so(tmp_path: pathlib.Path) -> None:
    f = shutdown_under_load(
        tmp_path,
        duration_s=2.0,
        signal_at_s=1.0,
        second_signal_after_s=0.5,
        drain_timeout_s=10.0,
        stall=True,
    )
    stderr = f.extra["stderr"]
    assert f.extra["exit_status"] not in (None, 0), stderr
    assert f.extra["exit_after_s"] < 0.5 + 1.0, stderr
    assert "second SIGTERM: exiting now, without draining" in stderr
    assert "accepted requests get no answer" in stderr
