"""Three replicas behind Debian's nginx with ``deploy/nginx/batchserve.conf``.

Each replica serves a sleeping model (passes of 20 ms, at most 2 items: 100 requests/s at
most, 300 for the fleet), so the fleet's capacity is set by the model, not by this
machine's 2 shared cores. Load comes from the project's open-loop generator; the servers
are judged by their own counters (``/metrics``) and nginx by its access log, which records
every attempt of every request.

* capacity: at 400 requests/s (past one replica's 100 and the fleet's 300), three replicas
  serve >= 2.7x what one serves through the same nginx configuration, and the fleet
  simulator predicts the three (goodput within 12%, p50 within 25%: see the test);
* counters: every replica received exactly the attempts nginx sent it, and answered ok
  exactly the requests whose last attempt it answered 200;
* rolling restart at 120/s (two replicas carry it): SIGTERM, wait for the exit, start
  again, next; no request lost: each gets 200, or 429 only after every replica refused it;
* SIGKILL of a replica at 120/s: the requests lost are at most those it held at that
  instant (attempts cut off mid-way in nginx's log), and every request that comes after
  it is served.

Tolerances: none on the counts; the simulator's as stated; the kill's edge is 100 ms (a
request scheduled within 100 ms after it may still have been sent to the dying replica).
Total time about 40 s.
"""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Iterator

import pytest

from batchserve.loadgen.config import LoadConfig
from batchserve.sim import simulate_fleet
from batchserve_testing.fleet import (
    MODEL,
    PASS_COST,
    SIM_CONFIG,
    SIM_OVERHEAD_S,
    Access,
    Fleet,
    delta,
    wait_quiet,
)
from batchserve_testing.harness import LoadRun, RequestCounts, percentile, run_load, unique_texts

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

INFER = "/v1/embeddings"
QUIET_S = 0.5  # between phases: the last phase's answers are all in


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    f = Fleet(pathlib.Path(__file__).resolve().parents[2] / "deploy/nginx/batchserve.conf")
    try:
        yield f
    finally:
        f.close()


def load(url: str, rate: float, duration_s: float, tag: str) -> LoadConfig:
    return LoadConfig(
        url=url,
        model=MODEL,
        texts=unique_texts(int(rate * duration_s) + 1, tag),
        timeout_s=2.0,
        rate=rate,
        duration_s=duration_s,
        warm_connections=8,
    )


def infer(accesses: list[Access]) -> list[Access]:
    return [a for a in accesses if a.uri == INFER]


def check_counters(
    fleet: Fleet,
    accesses: list[Access],
    before: list[RequestCounts | None],
    after: list[RequestCounts | None],
) -> None:
    """Each replica's counters match nginx's record of what it was sent and answered."""
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        if a is None or b is None:
            continue
        d = delta(a, b)
        addr = fleet.address(i)
        sent = sum(1 for acc in accesses for at in acc.attempts if at[0] == addr)
        ok = sum(1 for acc in accesses if acc.attempts and acc.attempts[-1][:2] == (addr, 200))
        refused = sum(
            1 for acc in accesses for at in acc.attempts if at[0] == addr and at[1] in (429, 503)
        )
        assert d["received"] == sent, (i, d, sent)
        assert d.get("ok", 0) == ok, (i, d, ok)
        assert d.get("rejected", 0) == refused, (i, d, refused)


def lost(run: LoadRun) -> list[int]:
    return [i for i, s in enumerate(run.status) if s not in (200, 429)]


def refused_by_the_whole_fleet(fleet: Fleet, accesses: list[Access]) -> None:
    """A 429 reached a client only after nginx tried every replica and none took it."""
    for acc in accesses:
        if acc.status == 429:
            tried = {at[0] for at in acc.attempts}
            assert len(tried) == len(fleet.ports), acc
            assert all(at[1] in (429, 502, 503) for at in acc.attempts), acc


def test_capacity_scales_and_counters_add_up(fleet: Fleet) -> None:
    wait_quiet(QUIET_S)
    duration_s, rate = 3.0, 400.0
    before = fleet.counts()
    mark = fleet.nginx.log_offset()
    one = run_load(load(fleet.one_url, rate, duration_s, "one"))  # also warms replica 0
    middle = fleet.counts()
    one_log = infer(fleet.nginx.accesses(mark))
    wait_quiet(QUIET_S)
    mark = fleet.nginx.log_offset()
    three_load = load(fleet.url, rate, duration_s, "three")
    three = run_load(three_load)
    after = fleet.counts()
    three_log = infer(fleet.nginx.accesses(mark))

    summary = f"one replica {one.statuses()}, three replicas {three.statuses()}"
    assert lost(one) == [], summary
    assert lost(three) == [], summary
    ratio = three.count(200) / one.count(200)
    print(f"capacity at {rate:g}/s: {summary}, goodput ratio {ratio:.2f}")
    assert ratio >= 2.7, f"goodput ratio {ratio:.2f}: {summary}"
    # One replica alone: nginx had nowhere else to send its refusals.
    assert {a.attempts[0][0] for a in one_log} == {fleet.address(0)}
    check_counters(fleet, one_log, before, middle)
    check_counters(fleet, three_log, middle, after)
    assert len(one_log) == one.n
    assert len(three_log) == three.n
    refused_by_the_whole_fleet(fleet, three_log)

    # The fleet simulator, on the same schedule with the same settings, predicts it. On a
    # quiet machine bench/fleets/fleet.py finds goodput within 3% and p50 within 8%; with another
    # process keeping a core busy the servers' own overhead grows (measured: goodput 5-8%
    # under the prediction, p50 10-13% over), hence the tolerances: 12% and 25%.
    predicted = simulate_fleet(
        replicas=3,
        routing="least_conn",
        config=SIM_CONFIG,
        cost=PASS_COST,
        arrivals=three_load.schedule(),
        timeout_s=three_load.timeout_s,
        duration_s=duration_s,
        overhead_s=SIM_OVERHEAD_S,
    ).summary
    p50_ms = percentile([three.latency_s(i) for i in three.indices(200)], 50) * 1e3
    vs = (
        f"ok {three.count(200)} vs predicted {predicted.ok}, "
        f"p50 {p50_ms:.1f} ms vs predicted {predicted.p50_ms:.1f} ms"
    )
    print(f"simulator: {vs}")
    assert abs(three.count(200) / predicted.ok - 1) <= 0.12, vs
    assert abs(p50_ms / predicted.p50_ms - 1) <= 0.25, vs


def test_rolling_restart_loses_no_request(fleet: Fleet) -> None:
    wait_quiet(QUIET_S)
    exits: list[int | None] = []
    done_at: list[float] = []

    def roll() -> None:
        time.sleep(1.0)
        for i in range(len(fleet.ports)):
            exits.append(fleet.restart(i))
            time.sleep(QUIET_S)
        done_at.append(time.monotonic())

    mark = fleet.nginx.log_offset()
    roller = threading.Thread(target=roll, daemon=True)
    roller.start()
    run = run_load(load(fleet.url, 120.0, 16.0, "roll"))
    ended_at = time.monotonic()
    roller.join(timeout=30)
    accesses = infer(fleet.nginx.accesses(mark))

    retried = sum(1 for a in accesses if len(a.attempts) > 1)
    summary = f"{run.statuses()}, exits {exits}, retried by nginx {retried}"
    print(f"rolling restart: {summary}")
    assert done_at, f"the restarts did not finish: {summary}"
    assert done_at[0] < ended_at, f"the restarts outlasted the load: {summary}"
    assert exits == [0, 0, 0], summary
    assert lost(run) == [], summary
    assert run.count(200) > 0.95 * run.n, summary
    refused_by_the_whole_fleet(fleet, accesses)
    # The replicas were restarted while nginx sent them work: some attempts met a draining
    # replica (503) or a closed port, and those requests were served elsewhere.
    assert retried > 0, summary
    assert len(accesses) == run.n


def test_sigkill_costs_only_the_requests_it_held(fleet: Fleet) -> None:
    wait_quiet(QUIET_S)
    victim = 2
    server = fleet.replicas[victim]
    assert server is not None
    kill_at: list[float] = []

    def kill() -> None:
        time.sleep(1.5)
        kill_at.append(time.monotonic())
        fleet.kill(victim)

    before = fleet.counts()
    mark = fleet.nginx.log_offset()
    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    try:
        run = run_load(load(fleet.url, 120.0, 5.0, "kill"))
        killer.join(timeout=10)
        after = fleet.counts()
        accesses = infer(fleet.nginx.accesses(mark))
        addr = fleet.address(victim)
        # Held at the kill: attempts on the victim that nginx had sent and that were cut off.
        held = sum(
            1 for a in accesses for at in a.attempts if at[0] == addr and at[1] == 502 and at[2]
        )
        refused_connections = sum(
            1 for a in accesses for at in a.attempts if at[0] == addr and at[2] == 0
        )
        gone = lost(run)
        print(
            f"SIGKILL: held {held}, lost {len(gone)}, later attempts that found it dead "
            f"{refused_connections}, statuses {run.statuses()}"
        )
        summary = f"held {held}, lost {gone}, statuses {run.statuses()}"
        assert len(gone) <= held, summary
        start = run.result.start_at
        after_kill = [i for i in range(run.n) if start + run.result.offsets[i] > kill_at[0] + 0.1]
        assert len(after_kill) > 300
        assert [i for i in after_kill if run.status[i] != 200] == [], summary
        check_counters(fleet, accesses, before, after)
        assert len(accesses) == run.n
    finally:
        killer.join(timeout=10)
        if fleet.replicas[victim] is None:
            fleet.start(victim)
