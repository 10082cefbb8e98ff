"""The simulator on a shape grid and with requests of several items: hand-computed figures.

A pass costs 0.5 s + 0.25 s an item (``COST``); a sub-pass 10 ms + 0.1 ms a token
(``SUBPASS``).
"""

import pytest

from batchserve.config import BatchConfig, CostEstimate
from batchserve.engines.passes import SubPasses
from batchserve.errors import ConfigError
from batchserve.sim import TraceEvent, simulate
from batchserve.subpasses import GRID, PassCost, ShapeGrid, predict_s, shape

COST = CostEstimate(fixed_s=0.5, per_item_s=0.25)
NONE = CostEstimate(fixed_s=0.0, per_item_s=0.0)
SUBPASS = PassCost(fixed_s=0.010, per_token_s=1e-4)


def one_pass(lengths: list[int], **kw: object) -> float:
    """The virtual seconds of one pass of these items (a backlog at 0, drained)."""
    r = simulate(
        config=BatchConfig(max_batch_size=64, batch_by="count", admission=False),
        cost=NONE,
        arrivals=[0.0] * len(lengths),
        sizes=lengths,
        subpass=SUBPASS,
        drain=True,
        **kw,  # type: ignore[arg-type]
    )
    assert r.batches == 1
    return r.end_s


def test_a_pass_on_the_grid_costs_its_allowed_counts_at_rounded_widths() -> None:
    # Five texts of 30 tokens: one sub-pass of 5 x 30 anywhere; on the grid 5 is no
    # allowed count and 30 runs at 32: 4 + 1 items (two sub-passes) of 32 tokens.
    assert one_pass([30] * 5) == pytest.approx(0.010 + 5 * 30 * 1e-4)
    assert one_pass([30] * 5, grid=GRID, window=256) == pytest.approx(2 * 0.010 + 5 * 32 * 1e-4)
    # The window caps the rounding: 250 tokens would run at 256, here at 250.
    assert one_pass([250], grid=GRID, window=250) == pytest.approx(0.010 + 250 * 1e-4)


def test_a_pass_on_the_grid_costs_what_the_engines_plan_predicts() -> None:
    lengths = [7, 9, 13, 14, 22, 31, 33, 40, 41, 58, 66, 90, 120, 200, 12, 12, 18]
    engine = SubPasses(SUBPASS, grid=GRID, window=256)
    groups = engine.plan(lengths)
    widths = [GRID.width(n, 256) for n in lengths]
    assert all(len(g) in GRID.counts for g in groups)
    expected = predict_s(shape(widths, groups), SUBPASS)
    assert one_pass(lengths, grid=GRID, window=256) == pytest.approx(expected, rel=1e-12)
    # A coarser grid computes more padding, so costs more; no grid costs least.
    coarse = ShapeGrid(steps=((256, 64),), counts=(1, 8, 32))
    assert one_pass(lengths) < expected < one_pass(lengths, grid=coarse, window=256)


def test_the_engines_token_counts_price_the_pass_and_the_estimates_form_it() -> None:
    # The policy is told 10 tokens a text; the engine counts 40: the pass costs 40 a text.
    r = simulate(
        config=BatchConfig(max_batch_size=64, admission=False),
        cost=NONE,
        arrivals=[0.0] * 4,
        sizes=[10] * 4,
        tokens=[40] * 4,
        subpass=SUBPASS,
        drain=True,
    )
    assert r.end_s == pytest.approx(0.010 + 4 * 40 * 1e-4)


def cfg(**kw: object) -> BatchConfig:
    base: dict[str, object] = {
        "max_batch_size": 4,
        "max_wait_s": 0.25,
        "admission": False,
        "prefetch": False,
    }
    base.update(kw)
    return BatchConfig(**base)  # type: ignore[arg-type]


def test_a_request_of_three_items_is_answered_when_its_last_item_is() -> None:
    # Two requests of 3 at 0: a full pass of 4 (request 0's three and one of request 1's)
    # ends at 0.5 + 4 x 0.25 = 1.5; request 1's other two run next: 1.5 + 0.5 + 0.5 = 2.5.
    r = simulate(config=cfg(), cost=COST, arrivals=[0.0, 0.0], items_per_request=3, trace=True)
    assert r.trace == (
        TraceEvent(0.0, "admit", (0,)),
        TraceEvent(0.0, "admit", (1,)),
        TraceEvent(0.0, "dispatch", (0, 1, 2, 3)),
        TraceEvent(1.5, "finish", (0, 1, 2, 3)),
        TraceEvent(1.5, "dispatch", (4, 5)),
        TraceEvent(2.5, "finish", (4, 5)),
    )
    s = r.summary
    assert (s.sent, s.ok, s.max_ms, r.batches, s.avg_batch) == (2, 2, 2500.0, 2, 3.0)
    assert s.ok_per_s == 0.8  # two requests over 2.5 s
    assert r.items_ok_per_s == pytest.approx(2.4)


def test_a_request_times_out_when_one_of_its_items_is_late() -> None:
    # Request 1's last two items would finish at 2.5, past its 2 s deadline.
    r = simulate(config=cfg(), cost=COST, arrivals=[0.0, 0.0], items_per_request=3, timeout_s=2.0)
    s = r.summary
    assert (s.ok, s.timed_out, s.max_ms) == (1, 1, 1500.0)


def test_a_refusal_of_one_item_refuses_the_request_and_withdraws_the_rest() -> None:
    # A queue of 4: request 1's second item is refused, its first withdrawn; request 0
    # runs alone, after the wait: 0.25 + 0.5 + 3 x 0.25 = 1.5.
    r = simulate(config=cfg(queue_size=4), cost=COST, arrivals=[0.0, 0.0], items_per_request=3)
    s = r.summary
    assert (s.ok, s.rejected, r.batches, s.avg_batch, s.max_ms) == (1, 1, 1, 3.0, 1500.0)
    assert s.rejected_by_reason == {"queue_full": 1}


def test_one_item_a_request_is_todays_simulation() -> None:
    kw: dict[str, object] = {
        "config": cfg(),
        "cost": COST,
        "arrivals": [0.0, 0.125, 1.0, 1.5],
        "timeout_s": 2.0,
    }
    assert simulate(**kw) == simulate(items_per_request=1, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"items_per_request": 0}, r"items_per_request"),
        ({"sizes": [5, 5, 5], "items_per_request": 2}, r"one size per item \(4\), got 3"),
        ({"grid": GRID}, r"grid needs subpass"),
        ({"subpass_busy": SUBPASS}, r"subpass_busy needs subpass"),
        ({"sizes": [5, 5], "tokens": [5, 5]}, r"tokens needs subpass or per_token_s"),
        (
            {"sizes": [5, 5], "tokens": [5], "subpass": SUBPASS},
            r"tokens must hold one count per item \(2\), got 1",
        ),
    ],
)
def test_bad_arguments_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate(config=cfg(), cost=COST, arrivals=[0.0, 1.0], **kw)  # type: ignore[arg-type]


def test_a_pass_beside_a_running_one_on_every_other_worker_costs_the_busy_cost() -> None:
    # Two workers, passes of one text of 10 tokens: the first begins alone (10 ms + 10 x
    # 0.1 ms), the second while the first runs (20 ms + 10 x 0.2 ms); the third once
    # both have ended, alone again.
    r = simulate(
        config=BatchConfig(max_batch_size=1, workers=2, admission=False, prefetch=False),
        cost=NONE,
        arrivals=[0.0, 0.0, 0.025],
        sizes=[10, 10, 10],
        subpass=SUBPASS,
        subpass_busy=PassCost(fixed_s=0.020, per_token_s=2e-4),
        drain=True,
        trace=True,
    )
    finishes = [e.time for e in r.trace if e.kind == "finish"]
    assert finishes == pytest.approx([0.011, 0.022, 0.036])
