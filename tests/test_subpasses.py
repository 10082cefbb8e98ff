import math
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchserve.subpasses import (
    GRID,
    PassCost,
    PassCostModel,
    Shape,
    ShapeGrid,
    padded_tokens,
    plan,
    predict_s,
    shape,
)

#: A CPU's shape: a sub-pass's fixed cost is worth about 20 tokens (MiniLM on one core:
#: ~5 ms fixed, ~250 us a token), attention shows on long texts.
CPU = PassCost(fixed_s=0.005, per_token_s=250e-6, attention_s=0.5e-6)
#: A GPU's shape: a launch is worth thousands of tokens, a token costs almost nothing.
GPU = PassCost(fixed_s=0.004, per_token_s=0.5e-6)


def cost_of(sizes: list[int], groups: list[list[int]], cost: PassCost) -> float:
    return predict_s(shape(sizes, groups), cost)


def partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for p in partitions(rest):
        for k in range(len(p)):
            yield [*p[:k], [first, *p[k]], *p[k + 1 :]]
        yield [[first], *p]


def test_an_empty_pass_has_no_subpasses() -> None:
    assert plan([], CPU) == []


def test_equal_lengths_stay_one_pass() -> None:
    assert plan([12] * 8, CPU) == [list(range(8))]


def test_on_a_cpu_a_long_passage_leaves_the_short_queries() -> None:
    sizes = [9, 250, 11, 10, 12, 8]
    groups = plan(sizes, CPU)
    assert groups == [[5, 0, 3, 2, 4], [1]]
    assert padded_tokens(sizes, groups) == 5 * 12 + 250  # vs 6 * 250 in one padded pass


def test_on_a_gpu_the_same_pass_stays_whole() -> None:
    sizes = [9, 250, 11, 10, 12, 8]
    assert plan(sizes, GPU) == [[5, 0, 3, 2, 4, 1]]


def test_a_cpu_cuts_a_realistic_mix_into_nearly_real_tokens() -> None:
    # 32 paragraphs with a long tail, like a technical manual's: padded, a pass computes
    # about 4x its real tokens; cut, at most 1.15x.
    sizes = [12, 14, 17, 19, 21, 22, 24, 26, 28, 30, 31, 33, 35, 36, 38, 40]
    sizes += [43, 45, 48, 51, 55, 60, 66, 72, 80, 90, 98, 110, 128, 160, 200, 256]
    real = sum(sizes)
    assert max(sizes) * len(sizes) / real > 3.5
    cpu = plan(sizes, CPU)
    assert padded_tokens(sizes, cpu) / real <= 1.15
    gpu = plan(sizes, GPU)
    assert len(gpu) < len(cpu)
    assert len(gpu) <= 3


def test_bounds_cap_a_subpass_but_an_item_alone_always_goes() -> None:
    assert sorted(len(g) for g in plan([10] * 10, GPU, max_items=4)) == [2, 4, 4]
    groups = plan([10, 10, 10, 500], GPU, max_tokens=100)
    assert groups == [[0, 1, 2], [3]]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=7),
    st.sampled_from([CPU, GPU, PassCost(fixed_s=0.02, per_token_s=1e-4, attention_s=1e-6)]),
    st.sampled_from([None, 2, 3]),
)
def test_the_plan_is_the_cheapest_partition(
    sizes: list[int], cost: PassCost, max_items: int | None
) -> None:
    groups = plan(sizes, cost, max_items=max_items)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    for g in groups:
        assert [sizes[i] for i in g] == sorted(sizes[i] for i in g)
        assert max_items is None or len(g) <= max_items
    allowed = [
        p
        for p in partitions(list(range(len(sizes))))
        if max_items is None or all(len(g) <= max_items for g in p)
    ]
    cheapest = min(cost_of(sizes, p, cost) for p in allowed)
    assert cost_of(sizes, groups, cost) == pytest.approx(cheapest, rel=1e-9)


def test_a_grid_rounds_widths_up_by_its_steps_within_the_window() -> None:
    grid = ShapeGrid(steps=((16, 4), (64, 16)), counts=(1, 2, 4))
    assert [grid.width(t) for t in (1, 4, 5, 16, 17, 64, 65, 100)] == [4, 4, 8, 16, 32, 64, 80, 112]
    assert grid.width(17, limit=20) == 20  # the window caps the rounding...
    assert grid.width(30, limit=20) == 30  # ...never the item
    assert grid.allowed(5) == [False, True, True, False, True, False]
    assert grid.size(window=64, max_items=4) == 7 * 3


@pytest.mark.parametrize(
    ("steps", "counts"),
    [((), (1,)), (((64, 0),), (1,)), (((64, 8), (16, 4)), (1,)), (((64, 8),), (2, 4))],
)
def test_a_grid_that_cannot_cover_every_pass_is_refused(
    steps: tuple[tuple[int, int], ...], counts: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError, match=r"steps|counts"):
        ShapeGrid(steps=steps, counts=counts)


def test_the_servers_grid_is_a_bounded_set_of_shapes() -> None:
    assert GRID.size(window=256, max_items=32) <= 400
    assert GRID.size(window=512, max_items=128) <= 600
    # At most 3 padded tokens up to 64, an eighth past it.
    assert all(GRID.width(t) - t <= max(3, t / 8) for t in range(1, 1025))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=7),
    st.sampled_from([CPU, PassCost(fixed_s=0.02, per_token_s=1e-4, attention_s=1e-6)]),
)
def test_on_a_grid_the_plan_is_the_cheapest_partition_of_grid_shapes(
    sizes: list[int], cost: PassCost
) -> None:
    grid = ShapeGrid(steps=((32, 8), (512, 32)), counts=(1, 2, 4, 6))
    groups = plan(sizes, cost, grid=grid, window=256)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    widths = [grid.width(s, 256) for s in sizes]

    def priced(p: list[list[int]]) -> float:
        return cost_of(widths, p, cost)

    assert all(len(g) in grid.counts for g in groups)
    allowed = [
        p for p in partitions(list(range(len(sizes)))) if all(len(g) in grid.counts for g in p)
    ]
    assert priced(groups) == pytest.approx(min(priced(p) for p in allowed), rel=1e-9)


def test_a_plan_is_a_pure_function_of_the_sizes() -> None:
    sizes = [30, 5, 30, 5, 120, 30]
    assert plan(sizes, CPU) == plan(list(sizes), CPU)
    assert plan(sizes, CPU)[0] == [1, 3]


def test_the_shape_counts_subpasses_tokens_and_squares() -> None:
    assert shape([3, 5, 4], [[0, 2], [1]]) == Shape(2, 2 * 4 + 5, 2 * 16 + 25)
    assert predict_s(Shape(2, 100, 1000), CPU) == pytest.approx(
        2 * 0.005 + 100 * 250e-6 + 1000 * 0.5e-6
    )


def test_a_negative_cost_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="per_token_s"):
        PassCost(fixed_s=0.0, per_token_s=-1.0)


def test_the_model_answers_its_prior_until_it_has_seen_enough() -> None:
    m = PassCostModel(CPU, min_samples=4)
    for _ in range(3):
        m.observe(Shape(1, 100, 10_000), 0.5)
    assert m.estimate == CPU
    assert m.samples == 3


def test_the_model_recovers_a_cost_from_subpasses_and_whole_passes() -> None:
    true = PassCost(fixed_s=0.006, per_token_s=300e-6, attention_s=0.8e-6)
    m = PassCostModel(PassCost(fixed_s=0.0, per_token_s=1e-3))
    for n, longest in [(1, 8), (4, 64), (8, 128), (16, 16), (32, 32), (2, 256), (1, 128)] * 3:
        m.observe(shape([longest] * n, [list(range(n))]), true.seconds(n, longest))
    m.observe(Shape(3, 500, 40_000), predict_s(Shape(3, 500, 40_000), true))
    est = m.estimate
    assert est.fixed_s == pytest.approx(true.fixed_s, rel=1e-6)
    assert est.per_token_s == pytest.approx(true.per_token_s, rel=1e-6)
    assert est.attention_s == pytest.approx(true.attention_s, rel=1e-6)


def test_the_model_never_learns_a_negative_cost() -> None:
    m = PassCostModel(CPU, min_samples=2)
    # Noise that a plain least squares would read as a negative fixed cost.
    m.observe(Shape(1, 10, 100), 0.0001)
    m.observe(Shape(1, 1000, 1_000_000), 0.5)
    m.observe(Shape(1, 100, 10_000), 0.06)
    est = m.estimate
    assert min(est.fixed_s, est.per_token_s, est.attention_s) >= 0
    assert math.isfinite(est.seconds(32, 64))
