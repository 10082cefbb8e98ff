"""Scenario 5: 1,000 requests whose clients disconnect while they are queued.

A pass is stuck (file flag) so the 1,000 requests wait in the queue; then every client
closes its connection. None of their inputs may reach the model (it records what it was
handed), the cancelled counters must match, the queued requests hold no tasks, and the
event loop's tasks and the process's memory must come back: three rounds on one server,
memory compared after the first and the last (tolerance 5%: the allocator keeps some of
what 1,000 connections used).
"""

from __future__ import annotations

import pathlib

import pytest

from batchserve_testing.scenarios import leaving_clients

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

CLIENTS = 1000


def test_clients_that_leave_are_never_computed_and_leave_nothing_behind(
    tmp_path: pathlib.Path,
) -> None:
    f = leaving_clients(tmp_path, clients=CLIENTS, rounds=3)
    rounds = f.extra["rounds"]
    for r in rounds:
        shown = {k: (len(v) if k == "leavers_seen" else v) for k, v in r.items()}
        assert r["filled"], shown
        assert r["depth"] == CLIENTS, shown
        assert r["emptied"], shown
        # None of their inputs reached the model.
        assert r["leavers_seen"] == [], shown
        # Every one of them is counted cancelled, and nothing else happened to them.
        assert r["received"] == CLIENTS, shown
        assert r["cancelled"] == CLIENTS, shown
        # The request that was in the stuck pass is answered once the model recovers.
        assert r["blocker_status"] == 200, shown
        # A queued request holds no task of its own (the connection protocol carries it
        # to the batcher): a thousand of them leave the event loop's task count as it was
        # (give or take the few the blocker and the scrapes hold), and nothing is left.
        assert r["tasks_busy"] <= r["tasks_idle"] + 5, shown
        assert r["tasks_after"] <= r["tasks_idle"], shown
    assert rounds[-1]["rss"] <= rounds[0]["rss"] * 1.05, [r["rss"] for r in rounds]
    assert f.counts is not None
    assert f.counts["cancelled"] == CLIENTS * len(rounds)
    assert f.counts["ok"] == len(rounds) + 1
