"""Profiling: the fit on exact numbers, the median against outliers, the file round trip,
and one real-time run recovering a synthetic model's costs."""

import itertools
import json
import pathlib
from collections.abc import Sequence

import pytest

from batchserve.cli import main
from batchserve.errors import ConfigError
from batchserve.models.profiling import (
    default_sizes,
    fit_line,
    load_profile,
    measure,
    profile_model,
    read_profile,
    save_profile,
)
from batchserve.models.synthetic import SyntheticModel


class FakeModel:
    """Each call moves a fake clock by fixed + n * per_item; chosen calls take `extra` more."""

    def __init__(self, fixed_s: float, per_item_s: float, slow_calls: Sequence[int] = ()) -> None:
        self.now = 0.0
        self.fixed_s = fixed_s
        self.per_item_s = per_item_s
        self.slow_calls = set(slow_calls)
        self.calls = 0

    def clock(self) -> float:
        return self.now

    def __call__(self, xs: Sequence[object]) -> list[object]:
        self.now += self.fixed_s + len(xs) * self.per_item_s
        if self.calls in self.slow_calls:
            self.now += 1.0
        self.calls += 1
        return list(xs)


def test_fit_recovers_an_exact_line() -> None:
    fit = fit_line([(n, 0.5 + n * 0.25) for n in (1, 2, 4, 8)])
    assert (fit.fixed_s, fit.per_item_s, fit.r_squared, fit.max_rel_residual) == (
        0.5,
        0.25,
        1.0,
        0.0,
    )


def test_fit_quality_reports_the_worst_relative_residual() -> None:
    fit = fit_line([(1, 1.0), (2, 2.0), (3, 3.3)])
    assert 0.9 < fit.r_squared < 1.0
    fitted = [fit.fixed_s + n * fit.per_item_s for n in (1, 2, 3)]
    want = max(abs(y - f) / y for y, f in zip((1.0, 2.0, 3.3), fitted, strict=True))
    assert fit.max_rel_residual == pytest.approx(want)


def test_fit_keeps_costs_non_negative() -> None:
    falling = fit_line([(1, 2.0), (2, 1.0)])
    assert (falling.fixed_s, falling.per_item_s) == (1.5, 0.0)
    through_origin = fit_line([(1, 0.0), (2, 1.0), (3, 2.0)])  # intercept would be -1
    assert through_origin.fixed_s == 0.0
    assert through_origin.per_item_s > 0.0


def test_measure_takes_the_median_so_one_slow_pass_does_not_move_it() -> None:
    model = FakeModel(0.5, 0.25, slow_calls=[1, 7])  # call 0 is the warm-up
    points = measure(model, [1, 4], repeats=5, timer=model.clock)
    assert points == [(1, 0.75), (4, 1.5)]
    assert model.calls == 11


def test_profile_model_on_a_fake_clock_recovers_the_costs_exactly() -> None:
    model = FakeModel(0.5, 0.25)
    prof = profile_model(model, model="fake", sizes=[1, 2, 3, 8], repeats=3, timer=model.clock)
    assert (prof.fixed_s, prof.per_item_s) == (0.5, 0.25)
    assert prof.points == ((1, 0.75), (2, 1.0), (3, 1.25), (8, 2.5))


def test_async_models_are_measured_too() -> None:
    model = FakeModel(0.5, 0.25)

    async def fn(xs: Sequence[object]) -> list[object]:
        return model(xs)

    assert measure(fn, [2], repeats=1, timer=model.clock) == [(2, 1.0)]


def test_default_sizes() -> None:
    assert default_sizes(1) == [1]
    assert default_sizes(8) == [1, 2, 3, 4, 5, 6, 7, 8]
    sizes = default_sizes(64)
    assert sizes[:8] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sizes[-1] == 64
    assert all(b / a <= 1.3 for a, b in itertools.pairwise(sizes[7:]))


def test_profile_file_round_trip(tmp_path: pathlib.Path) -> None:
    model = FakeModel(0.5, 0.25)
    prof = profile_model(model, model="fake", sizes=[1, 2], repeats=1, timer=model.clock)
    path = tmp_path / "p.json"
    save_profile(prof, path)
    assert read_profile(path) == prof
    est = load_profile(path)
    assert (est.fixed_s, est.per_item_s) == (0.5, 0.25)
    data = json.loads(path.read_text())
    assert set(data) >= {"model", "fixed_s", "per_item_s", "r_squared", "max_rel_residual"}


def test_bad_profile_files_name_the_problem(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "p.json"
    with pytest.raises(ConfigError, match="cannot be read"):
        load_profile(path)
    path.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_profile(path)
    path.write_text('{"fixed_s": "8ms", "per_item_s": 0.001}')
    with pytest.raises(ConfigError, match="fixed_s must be a number"):
        load_profile(path)
    path.write_text('{"fixed_s": -1, "per_item_s": 0.001}')
    with pytest.raises(ConfigError, match="fixed_s must be >= 0"):
        load_profile(path)


def test_measure_refuses_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="repeats must be >= 1"):
        measure(FakeModel(1, 1), [1], repeats=0)
    with pytest.raises(ConfigError, match="inputs must hold at least 4"):
        measure(FakeModel(1, 1), [4], inputs=["a"])


@pytest.mark.slow
def test_profile_recovers_a_synthetic_models_costs_within_10_percent() -> None:
    # Real sleeps: 20 ms + 1 ms per item. Sleeping overshoots by ~0.1 ms, 0.5% of the fixed
    # cost; the tolerance (10%) leaves room for a busy machine (with four other processes
    # on two cores the slope once read 5.7% high).
    model = SyntheticModel(0.020, 0.001)
    prof = profile_model(model, model="synthetic", sizes=[1, 2, 4, 8, 16], repeats=5)
    assert prof.fixed_s == pytest.approx(0.020, rel=0.1)
    assert prof.per_item_s == pytest.approx(0.001, rel=0.1)
    assert prof.r_squared > 0.99


@pytest.mark.slow
def test_cli_profile_writes_a_file_simulate_accepts(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prof.json"
    # Real sleeps; costs large enough that sleeping's overshoot (~0.1-0.4 ms) stays small.
    spec = "synthetic:fixed=20ms,per_item=1ms,dim=0"
    assert (
        main(["profile", "--model", spec, "--sizes", "1,2,4,8", "--repeats", "5", "-o", str(out)])
        == 0
    )
    text = capsys.readouterr().out
    assert "fit: " in text
    assert "R^2" in text
    est = load_profile(out)
    assert est.fixed_s == pytest.approx(0.020, rel=0.1)
    assert est.per_item_s == pytest.approx(0.001, rel=0.1)
    assert main(["simulate", "--profile", str(out), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["fixed_s"] == est.fixed_s
