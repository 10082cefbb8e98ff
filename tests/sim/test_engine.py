"""The simulator on hand-computed cases: exact virtual times, whole timelines in one ``==``.

Costs and times are multiples of 1/8 so every sum is exact in binary floating point.
"""

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.sim import TraceEvent, simulate
from batchserve.workload.arrivals import arrival_times

# A pass costs 0.5 s + 0.25 s per item.
COST = CostEstimate(fixed_s=0.5, per_item_s=0.25)


def cfg(**kw: object) -> BatchConfig:
    # One pass dispatched at a time, so the traces read simply; prefetch has its own tests.
    base: dict[str, object] = {
        "max_batch_size": 4,
        "max_wait_s": 0.25,
        "admission": False,
        "prefetch": False,
    }
    base.update(kw)
    return BatchConfig(**base)  # type: ignore[arg-type]


def test_single_request_waits_max_wait_then_runs_alone() -> None:
    r = simulate(config=cfg(), cost=COST, arrivals=[1.0], trace=True)
    assert r.trace == (
        TraceEvent(1.0, "admit", (0,)),
        TraceEvent(1.25, "dispatch", (0,)),
        TraceEvent(2.0, "finish", (0,)),
    )
    s = r.summary
    assert (s.ok, s.p50_ms, s.max_ms, s.avg_batch, r.batches, r.end_s) == (
        1,
        1000.0,
        1000.0,
        1.0,
        1,
        2.0,
    )


def test_overhead_is_added_to_every_pass_and_learned_by_the_servers_cost_model() -> None:
    r = simulate(
        config=cfg(max_wait_s=0.0), cost=COST, arrivals=[0.0, 1.0], overhead_s=0.125, trace=True
    )
    assert [e for e in r.trace if e.kind == "finish"] == [
        TraceEvent(0.875, "finish", (0,)),
        TraceEvent(1.875, "finish", (1,)),
    ]
    assert r.stats.cost.fixed_s == 0.875  # one size seen: the slope stays at its start (0)


def test_full_batch_goes_at_once_when_the_last_item_fills_it() -> None:
    r = simulate(
        config=cfg(max_wait_s=10.0), cost=COST, arrivals=[0.0, 0.125, 0.25, 0.375], trace=True
    )
    assert r.trace[-2:] == (
        TraceEvent(0.375, "dispatch", (0, 1, 2, 3)),
        TraceEvent(1.875, "finish", (0, 1, 2, 3)),
    )
    # Latencies 1.875 - arrival, sorted: 1.5, 1.625, 1.75, 1.875 s.
    assert r.summary.max_ms == 1875.0
    assert r.summary.p50_ms == 1625.0  # the seed's rule: sorted[int(0.5 * 3)] = sorted[1]
    assert r.summary.avg_batch == 4.0


def test_batch_closed_by_max_wait_from_the_oldest_item() -> None:
    r = simulate(config=cfg(max_wait_s=0.5), cost=COST, arrivals=[0.0, 0.125], trace=True)
    assert r.trace == (
        TraceEvent(0.0, "admit", (0,)),
        TraceEvent(0.125, "admit", (1,)),
        TraceEvent(0.5, "dispatch", (0, 1)),
        TraceEvent(1.5, "finish", (0, 1)),
    )


def test_next_batch_forms_while_the_worker_is_busy_and_goes_when_it_is_free() -> None:
    r = simulate(config=cfg(max_wait_s=0.0), cost=COST, arrivals=[0.0, 0.25, 0.5], trace=True)
    assert [e for e in r.trace if e.kind in ("dispatch", "finish")] == [
        TraceEvent(0.0, "dispatch", (0,)),
        TraceEvent(0.75, "finish", (0,)),
        TraceEvent(0.75, "dispatch", (1, 2)),
        TraceEvent(1.75, "finish", (1, 2)),
    ]


def test_expiry_in_the_queue_at_the_deadline() -> None:
    # One worker busy with request 0 until 0.75; request 1's deadline (0.625) passes queued.
    r = simulate(
        config=cfg(max_batch_size=1, max_wait_s=0.0),
        cost=COST,
        arrivals=[0.0, 0.125],
        timeout_s=0.5,
        trace=True,
    )
    assert r.trace == (
        TraceEvent(0.0, "admit", (0,)),
        TraceEvent(0.0, "dispatch", (0,)),
        TraceEvent(0.125, "admit", (1,)),
        TraceEvent(0.5, "late", (0,)),
        TraceEvent(0.625, "expire", (1,)),
        TraceEvent(0.75, "finish", (0,)),
    )
    # Request 0's deadline (0.5) passed during its pass: the policy reports it late then,
    # and it is answered at its deadline, as the server answers it; the pass ends at 0.75.
    assert (r.summary.ok, r.late, r.expired, r.summary.timed_out) == (0, 1, 1, 2)


def test_a_prefetched_pass_begins_when_the_running_one_ends() -> None:
    # Request 1 fills a batch of one while request 0's pass runs: it is dispatched at once
    # and its pass begins at 0.75, when the first ends, and ends at 1.5.
    r = simulate(
        config=cfg(max_batch_size=1, max_wait_s=0.0, prefetch=True),
        cost=COST,
        arrivals=[0.0, 0.125],
        trace=True,
    )
    assert r.trace == (
        TraceEvent(0.0, "admit", (0,)),
        TraceEvent(0.0, "dispatch", (0,)),
        TraceEvent(0.125, "admit", (1,)),
        TraceEvent(0.125, "dispatch", (1,)),
        TraceEvent(0.75, "finish", (0,)),
        TraceEvent(1.5, "finish", (1,)),
    )
    assert (r.summary.ok, r.end_s) == (2, 1.5)


def test_a_prefetched_item_whose_deadline_passes_before_its_pass_expires() -> None:
    # Request 1's deadline (0.625) passes while its pass waits behind request 0's (to
    # 0.75): it expires then, as in the queue, and its pass, left with nothing to run,
    # takes no time.
    r = simulate(
        config=cfg(max_batch_size=1, max_wait_s=0.0, prefetch=True),
        cost=COST,
        arrivals=[0.0, 0.125, 1.0],
        timeout_s=0.5,
        trace=True,
    )
    assert r.trace[3:] == (
        TraceEvent(0.125, "dispatch", (1,)),
        TraceEvent(0.5, "late", (0,)),
        TraceEvent(0.625, "expire", (1,)),
        TraceEvent(0.75, "finish", (0,)),
        TraceEvent(0.75, "finish", (1,)),
        TraceEvent(1.0, "admit", (2,)),
        TraceEvent(1.0, "dispatch", (2,)),
        TraceEvent(1.5, "late", (2,)),
        TraceEvent(1.75, "finish", (2,)),
    )
    assert r.summary.avg_batch == 1.0  # two passes of one item: the empty one is none
    assert (r.late, r.expired) == (2, 1)


def test_queue_full_refusal_and_its_reason() -> None:
    r = simulate(
        config=cfg(max_batch_size=1, max_wait_s=0.0, queue_size=1),
        cost=COST,
        arrivals=[0.0, 0.125, 0.25],
        trace=True,
    )
    assert r.trace[:4] == (
        TraceEvent(0.0, "admit", (0,)),
        TraceEvent(0.0, "dispatch", (0,)),
        TraceEvent(0.125, "admit", (1,)),
        TraceEvent(0.25, "reject", (2,), "queue_full"),
    )
    assert r.summary.rejected_by_reason == {"queue_full": 1}
    assert (r.summary.ok, r.summary.rejected) == (2, 1)


def test_infeasible_refusal_uses_the_servers_cost_model() -> None:
    # The server's cost model starts from the true cost: request 1 would finish at
    # 0.75 + 0.75 = 1.5 (plus the 2% drift margin), after its deadline 0.125 + 1.0.
    config = cfg(max_batch_size=1, max_wait_s=0.0, admission=True, initial_cost=COST)
    r = simulate(config=config, cost=COST, arrivals=[0.0, 0.125], timeout_s=1.0, trace=True)
    assert r.trace == (
        TraceEvent(0.0, "admit", (0,)),
        TraceEvent(0.0, "dispatch", (0,)),
        TraceEvent(0.125, "reject", (1,), "infeasible"),
        TraceEvent(0.75, "finish", (0,)),
    )


def test_simultaneous_arrivals_are_queued_together_and_drain_skips_max_wait() -> None:
    r = simulate(config=cfg(max_wait_s=5.0), cost=COST, arrivals=[0.0] * 6, drain=True, trace=True)
    assert [e for e in r.trace if e.kind == "dispatch"] == [
        TraceEvent(0.0, "dispatch", (0, 1, 2, 3)),
        TraceEvent(1.5, "dispatch", (4, 5)),
    ]
    assert r.end_s == 2.5


def test_two_workers_run_two_passes_at_once() -> None:
    r = simulate(
        config=cfg(max_batch_size=1, max_wait_s=0.0, workers=2),
        cost=COST,
        arrivals=[0.0, 0.0, 0.0],
        trace=True,
    )
    assert [e for e in r.trace if e.kind == "finish"] == [
        TraceEvent(0.75, "finish", (0,)),
        TraceEvent(0.75, "finish", (1,)),
        TraceEvent(1.5, "finish", (2,)),
    ]


def test_outcomes_add_up_and_match_the_policys_counters() -> None:
    sched = arrival_times(rate=900, duration_s=2.0, arrivals="poisson", seed=7)
    config = BatchConfig(max_batch_size=8, max_wait_s=0.002, queue_size=16)
    r = simulate(
        config=config,
        cost=CostEstimate(fixed_s=0.008, per_item_s=0.00025),
        arrivals=sched,
        timeout_s=0.05,
        duration_s=2.0,
    )
    s, c = r.summary, r.stats.counters
    assert s.sent == len(sched) == c.received
    assert s.ok + s.rejected + r.late + r.expired == s.sent
    assert (s.ok, r.late, r.expired, s.rejected) == (c.ok, c.late, c.expired, c.rejected_total)
    assert c.pending == 0
    assert s.rejected > 0  # an overload, so the check above is not vacuous


def test_same_seed_same_result_and_another_seed_differs() -> None:
    def once(seed: int) -> dict[str, object]:
        sched = arrival_times(rate=700, duration_s=1.0, arrivals="poisson", seed=seed)
        config = BatchConfig(max_batch_size=16, max_wait_s=0.002, queue_size=64)
        cost = CostEstimate(fixed_s=0.008, per_item_s=0.00025)
        return simulate(
            config=config, cost=cost, arrivals=sched, timeout_s=0.1, duration_s=1.0
        ).to_dict()

    assert once(1) == once(1)
    assert once(1) != once(2)


def test_the_server_cost_model_learns_the_true_cost() -> None:
    sched = arrival_times(rate=600, duration_s=2.0, arrivals="poisson", seed=0)
    r = simulate(
        config=BatchConfig(max_batch_size=32, max_wait_s=0.002),
        cost=CostEstimate(fixed_s=0.008, per_item_s=0.00025),
        arrivals=sched,
    )
    assert r.stats.cost.fixed_s == pytest.approx(0.008, rel=1e-6)
    assert r.stats.cost.per_item_s == pytest.approx(0.00025, rel=1e-6)


@pytest.mark.parametrize(
    ("arrivals", "message"), [([0.5, 0.25], "must be sorted"), ([-1.0], "must be >= 0")]
)
def test_bad_arrivals_are_refused(arrivals: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        simulate(config=cfg(), cost=COST, arrivals=arrivals)


def test_empty_schedule_is_an_empty_result() -> None:
    r = simulate(config=cfg(), cost=COST, arrivals=[], duration_s=1.0)
    assert (r.summary.sent, r.summary.ok, r.batches, r.summary.ok_per_s) == (0, 0, 0, 0.0)


def test_under_sustained_overload_admission_keeps_every_batch_full() -> None:
    # 5x the capacity of 20 ms + 2.5 ms per item in batches of 8 (200 items/s), 250 ms
    # deadlines: admission refuses what cannot make it, and what it admits fills whole
    # batches (an item behind a full batch is predicted in a full batch, so later arrivals
    # may still join its batch instead of being refused and leaving it part-full).
    cost = CostEstimate(fixed_s=0.020, per_item_s=0.0025)
    config = BatchConfig(
        max_batch_size=8, max_wait_s=0.002, queue_size=1024, admission=True, initial_cost=cost
    )
    arrivals = arrival_times(rate=1000.0, duration_s=10.0, arrivals="poisson", seed=2)
    r = simulate(config=config, cost=cost, arrivals=arrivals, timeout_s=0.25, duration_s=10.0)
    s = r.summary
    assert s.avg_batch > 7.9
    assert s.ok_per_s > 0.98 * 200
    assert r.late == 0
    assert r.expired == 0
