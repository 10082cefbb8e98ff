import pytest

from batchserve.config import CostEstimate
from batchserve.costmodel import CostModel


def test_starting_estimate_until_first_observation() -> None:
    m = CostModel(CostEstimate(fixed_s=0.005, per_item_s=0.001))
    assert m.cost(10) == pytest.approx(0.015)
    assert m.samples == 0
    assert m.spread_s == 0.0


def test_exact_fit_recovers_coefficients() -> None:
    m = CostModel(CostEstimate(fixed_s=0.0, per_item_s=0.0))
    for n in list(range(1, 33)) * 10:
        m.observe(n, 0.008 + n * 0.00025)
    assert m.estimate.fixed_s == pytest.approx(0.008)
    assert m.estimate.per_item_s == pytest.approx(0.00025)
    # Early predictions (before the slope was known) were off; that error has decayed away.
    assert m.spread_s < 1e-6


def test_single_batch_size_keeps_starting_slope() -> None:
    m = CostModel(CostEstimate(fixed_s=0.0, per_item_s=0.001))
    for _ in range(5):
        m.observe(4, 0.012)
    assert m.estimate.per_item_s == pytest.approx(0.001)
    assert m.estimate.fixed_s == pytest.approx(0.008)


def test_coefficients_never_negative() -> None:
    m = CostModel(CostEstimate(fixed_s=0.0, per_item_s=0.0))
    m.observe(1, 0.010)
    m.observe(10, 0.001)
    assert m.estimate.per_item_s >= 0
    assert m.estimate.fixed_s >= 0


def test_decay_follows_a_model_that_got_slower() -> None:
    m = CostModel(CostEstimate(fixed_s=0.0, per_item_s=0.0), decay=0.9)
    for n in (1, 2) * 50:
        m.observe(n, 0.010)
    for n in (1, 2) * 50:
        m.observe(n, 0.020)
    assert m.cost(1) == pytest.approx(0.020, rel=0.01)


def test_ignores_empty_batches_and_rejects_bad_decay() -> None:
    m = CostModel(CostEstimate(fixed_s=0.0, per_item_s=0.0))
    m.observe(0, 1.0)
    assert m.samples == 0
    with pytest.raises(ValueError, match="decay"):
        CostModel(CostEstimate(fixed_s=0.0, per_item_s=0.0), decay=0.0)
