"""Scenario 1: open-loop load at 5x the model's capacity for 10 s (after 3 s of warm-up).

The model (20 ms + 2.5 ms per item, batches of 8) serves 200 items/s; 1,000 requests/s
arrive (Poisson), each with a 250 ms deadline. The Go seed, at batch size 1, keeps 17% of
its capacity in the same situation. The server is judged by its own account where the
client's stopwatch would judge the machine: client and server share two cores, and the
suite must pass with another process keeping one of them busy.

Tolerances, stated once:

* no success is answered past its deadline by the server's own account (``Server-Timing``,
  from the request's first byte, which is where its deadline counts from; 2 ms for the
  write itself), and every answer reaches the client within its deadline + 100 ms of the
  write;
* a refusal's p99 is under 5 ms by the server's own account, from the request's first byte
  to its answer (refusals are decided from the head, before the body is read; 5 ms is a
  GIL switch interval, in case the model's thread holds it), and under 25 ms from the
  client's write to the answer it reads: the client shares the machine's free core with
  the server and the model's thread, and a process that waits for that core waits a few
  scheduler slices (measured here: 7-11 ms with one core kept busy);
* goodput is at least 90% of capacity: the model's nominal 200 items/s, or less where the
  server's own records show the model itself was slower on this machine (a sleeping model
  overshoots its sleeps when the CPUs are contended: items per second of forward time);
  and the model was kept busy at least 90% of the run;
* RSS grows less than 10% after warm-up.

A failure's message gives the CPU the server got (share of one core) and the CPU pressure
over the run (Linux PSI "some", the share of time runnable tasks waited for a CPU), so a
starved machine can be told from a slow server.
"""

from __future__ import annotations

import time

import pytest

from batchserve_testing.process import cpu_pressure_s
from batchserve_testing.scenarios import overload

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

MARGIN_S = 0.1


def test_overload_at_five_times_capacity() -> None:
    pressure = cpu_pressure_s()
    t0 = time.monotonic()
    # 10 s, 10,000 requests: the queue is full from the first 100 ms on, so a longer run
    # repeats the same state (RSS grows or not after the warm-up) at 1 s of suite per second
    f = overload(duration_s=10.0, factor=5.0)
    waited = (cpu_pressure_s() - pressure) / (time.monotonic() - t0)
    assert f.run is not None
    assert f.counts is not None
    deadline = f.extra["deadline_s"]
    summary = (
        f"statuses {f.extra['statuses']}, goodput {f.goodput:.1f}/s of {f.capacity:.0f} "
        f"nominal, {f.extra['model_capacity']:.1f} measured (model busy "
        f"{f.extra['model_busy']:.0%}), "
        f"429 p99 {f.refusal_p99_s * 1e3:.2f} ms (server's account "
        f"{f.extra['refusal_p99_server_s'] * 1e3:.3f} ms), "
        f"late 200s {f.extra['late_ok']} (client's stopwatch: {f.extra['late_ok_client']}), "
        f"max answer {f.extra['max_response_s']:.3f} s, "
        f"RSS {f.rss_before / 1e6:.1f} -> {f.rss_after / 1e6:.1f} MB, {f.counts.row()}; "
        f"server CPU {f.extra['server_cpu']:.0%} of a core, CPU pressure {waited:.0%}"
    )
    print(summary)
    # The server stays up and every request gets an answer, none later than its deadline
    # plus the margin.
    assert f.extra["healthy_after"], summary
    assert f.lost == 0, summary
    assert f.extra["max_response_s"] <= deadline + MARGIN_S, summary
    # Goodput holds at capacity, and no success came after its deadline.
    assert f.capacity is not None
    assert f.goodput >= 0.9 * min(f.capacity, f.extra["model_capacity"]), summary
    assert f.extra["model_busy"] >= 0.9, summary
    assert f.extra["late_ok"] == 0, summary
    # Refusals are immediate.
    assert f.refusals > 0.5 * f.offered, summary
    assert f.extra["refusal_p99_server_s"] < 0.005, summary
    assert f.refusal_p99_s < 0.025, summary
    # Memory stays bounded.
    assert f.rss_growth < 0.10, summary
    # The server's own counters add up and agree with what the clients saw.
    assert f.counts.received >= f.offered  # the warm-up's requests are counted too
    assert f.counts["ok"] >= f.ok
