"""The sweep's plot: a log latency axis labelled densely enough to read, whatever its range."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace
from typing import Any, cast

import pytest

from batchserve.loadgen.sweep import log_ticks, plot_sweep


@pytest.mark.parametrize(
    ("lo", "hi", "ticks"),
    [
        # the range that drew one labelled tick (20 ms) before
        (5, 23, [5, 7, 10, 15, 20, 30]),
        (2, 40, [2, 5, 10, 20, 50]),
        (1, 1000, [1, 10, 100, 1000]),
        (0.3, 2500, [0.1, 1, 10, 100, 1000, 10000]),
        (11, 14, [10, 15]),
    ],
)
def test_log_ticks_label_every_range(lo: float, hi: float, ticks: list[float]) -> None:
    assert log_ticks(lo, hi) == ticks


def test_log_ticks_refuse_a_range_a_log_axis_cannot_draw() -> None:
    with pytest.raises(ValueError, match="0 < lo <= hi"):
        log_ticks(0, 5)


def test_the_plot_labels_a_narrow_latency_range_at_several_ticks(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    drawn: list[Any] = []
    real_savefig = matplotlib.figure.Figure.savefig

    def savefig(self: Any, *args: Any, **kwargs: Any) -> None:
        drawn.append(self)
        real_savefig(self, *args, **kwargs)

    reports = [
        SimpleNamespace(
            achieved_per_s=rate,
            summary=SimpleNamespace(
                offered_per_s=rate, ok_per_s=rate, p50_ms=p50, p99_ms=p99, avg_batch=batch
            ),
        )
        for rate, p50, p99, batch in [(100, 5, 8, 1.2), (200, 6, 11, 2.5), (400, 9, 23, 6.0)]
    ]
    out = tmp_path / "sweep.png"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "savefig", savefig)
        plot_sweep(cast(Any, reports), out, title="narrow")
    assert out.stat().st_size > 10_000
    lat_ax = drawn[0].axes[1]
    labels = [t.get_text() for t in lat_ax.get_yticklabels() if t.get_text()]
    assert labels == ["5", "7", "10", "15", "20", "30"]
