"""The tuner: its grid, its ranking rule on plain numbers, and searches on the simulator."""

import asyncio
import json

import pytest

from batchserve.cli import main
from batchserve.config import CostEstimate
from batchserve.loadgen.inprocess import run_open_loop
from batchserve.models.synthetic import SyntheticModel
from batchserve.sim.tuning import (
    Evaluation,
    Scenario,
    Setting,
    _rank,
    candidate_grid,
    max_rate,
    rate_bound,
    tune,
)
from batchserve.workload.arrivals import arrival_times

SEED = CostEstimate(fixed_s=0.008, per_item_s=0.00025)


def ev(n: int, wait: float, workers: int, served: float, p99: float) -> Evaluation:
    return Evaluation(
        setting=Setting(max_batch_size=n, max_wait_s=wait, workers=workers),
        runs=1,
        sent=1000,
        ok_per_s=served * 600,
        served=served,
        avg_batch=1.0,
        p50_ms=p99 / 2,
        p99_ms=p99,
        rejected=1 - served,
        timed_out=0.0,
        p99_target_ms=50.0,
        max_loss=0.01,
    )


def test_rank_prefers_goodput_then_low_p99_then_the_simplest_setting() -> None:
    over = ev(64, 0.0, 1, 1.0, 60.0)  # serves all, but over the target
    starved = ev(1, 0.0, 1, 0.5, 10.0)  # within the target by refusing half
    slow = ev(32, 0.02, 1, 1.0, 30.0)
    fast_many = ev(8, 0.002, 4, 0.999, 11.0)
    fast_one = ev(8, 0.002, 1, 1.0, 11.4)  # p99 within 5% of the lowest, fewer workers
    ranked = _rank([over, starved, slow, fast_many, fast_one])
    assert ranked[0] is fast_one
    assert ranked[1:4] == [fast_many, slow, starved]
    assert ranked[-1] is over
    assert not over.feasible
    assert starved.feasible
    assert not starved.meets


def test_rank_with_nothing_feasible_puts_the_most_served_first() -> None:
    a, b = ev(8, 0.0, 1, 0.9, 70.0), ev(8, 0.0, 1, 1.0, 80.0)
    assert _rank([a, b]) == [b, a]


def test_grid_has_powers_of_two_the_knee_and_waits_below_the_target() -> None:
    sc = Scenario(rate=600, p99_target_s=0.05, cost=SEED)
    grid = candidate_grid(sc, max_workers=1)
    sizes = sorted({s.max_batch_size for s in grid})
    # 2 * rate * target = 60 items: powers of two up to 64. The knee: 600 * 8ms / (1 - 0.15)
    # = 5.6, so 6 and 12.
    assert sizes == [1, 2, 4, 6, 8, 12, 16, 32, 64]
    waits = sorted({s.max_wait_s for s in grid})
    assert waits == [0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02]
    assert {s.workers for s in grid} == {1}
    assert len(grid) == len(sizes) * len(waits)


def test_rate_bound() -> None:
    # 50 ms holds passes of up to (50 - 8) / 0.25 = 168 items: 168 / 50 ms = 3360/s per worker.
    sc = Scenario(rate=600, p99_target_s=0.05, cost=SEED)
    assert rate_bound(sc, max_workers=1) == pytest.approx(3360.0)
    assert rate_bound(sc, max_workers=2) == pytest.approx(6720.0)
    assert rate_bound(Scenario(rate=600, p99_target_s=0.008, cost=SEED)) == 0.0


@pytest.mark.parametrize("bad", [{"rate": 0}, {"p99_target_s": -1.0}, {"max_loss": 1.0}])
def test_scenario_validates(bad: dict[str, float]) -> None:
    kw: dict[str, object] = {"rate": 600.0, "p99_target_s": 0.05, "cost": SEED, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        Scenario(**kw)  # type: ignore[arg-type]


def test_tune_the_seed_model_at_600_per_s_within_50ms() -> None:
    result = tune(Scenario(rate=600, p99_target_s=0.05, cost=SEED), max_workers=1)
    assert result.met
    best = result.best
    assert best is not None
    assert best.p99_ms <= 50.0
    assert best.served >= 0.99
    assert best.setting.max_batch_size >= 6  # one item per pass cannot keep up with 600/s
    assert result.max_rate is None
    assert result.ranked[0] is best


@pytest.mark.slow
def test_an_unmeetable_rate_says_which_rate_could_be_met() -> None:
    # Slow: a bisection of searches, about ten seconds of simulation.
    sc = Scenario(rate=3000, p99_target_s=0.03, cost=SEED)
    waits = (0.0, 0.002)
    result = tune(sc, max_workers=1, waits_s=waits)
    assert not result.met
    assert result.max_rate is not None
    assert 0 < result.max_rate < rate_bound(sc, max_workers=1)
    at_max = tune(
        Scenario(rate=result.max_rate, p99_target_s=0.03, cost=SEED),
        max_workers=1,
        waits_s=waits,
        search_max_rate=False,
    )
    assert at_max.met


def test_a_target_below_one_pass_is_refused_without_searching() -> None:
    result = tune(Scenario(rate=600, p99_target_s=0.005, cost=SEED))
    assert (result.met, result.best, result.searched, result.max_rate) == (False, None, 0, 0.0)
    assert max_rate(Scenario(rate=600, p99_target_s=0.005, cost=SEED)) == 0.0


def test_cli_tune_json_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--rate", "600", "--p99", "50ms", "--max-workers", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["met"] is True
    assert out["best"]["p99_ms"] <= 50.0
    assert main(["tune", "--rate", "600", "--p99", "5ms"]) == 1
    assert "one pass of one item takes 8.25ms" in capsys.readouterr().out


async def _longest_stall(stop: asyncio.Event) -> float:
    # How late a 1 ms sleep wakes, at worst, while the run lasts: the time the process (the
    # event loop that drives the batcher and the load) did not run.
    loop = asyncio.get_running_loop()
    worst = 0.0
    while not stop.is_set():
        t0 = loop.time()
        await asyncio.sleep(0.001)
        worst = max(worst, loop.time() - t0 - 0.001)
    return worst


#: A run in which the event loop stalled longer than this is no evidence about the setting
#: (the machine took the CPU away: every item in flight waited), so it is run again.
_STALL_S = 0.02


@pytest.mark.slow
async def test_the_setting_tune_picks_is_measured_within_the_target() -> None:
    # Real time: 1.5 s of the seed's load on the in-process Batcher with the tuned setting.
    # The prediction is ~20 ms; the 50 ms target leaves room for a busy machine. A run the
    # process was stalled in for over 20 ms (measured beside it) is run again, up to three.
    scenario = Scenario(rate=600, p99_target_s=0.05, cost=SEED)
    best = tune(scenario, max_workers=1).best
    assert best is not None
    stalls = []
    for _ in range(3):
        stop = asyncio.Event()
        watch = asyncio.create_task(_longest_stall(stop))
        row = await run_open_loop(
            name="tuned",
            model=SyntheticModel(SEED.fixed_s, SEED.per_item_s),
            config=scenario.config(best.setting),
            schedule=arrival_times(rate=600, duration_s=1.5),
            timeout_s=scenario.timeout_s,
            duration_s=1.5,
        )
        stop.set()
        stalls.append(await watch)
        if stalls[-1] <= _STALL_S:
            break
    else:
        pytest.fail(f"the event loop stalled in every run: {stalls} s; the machine is too busy")
    assert row.p99_ms <= 50.0, f"p99 {row.p99_ms:.1f} ms; stalls {stalls}"
    assert row.ok >= 0.95 * row.sent
