"""Several runs at increasing offered rates, and the picture that tells the story.

:func:`run_sweep` runs one config per rate in turn, with a pause between runs so the
server's queue drains. :func:`plot_sweep` draws two panels: what the server delivered
against what was offered (achieved send rate and ok/s, with the diagonal: where ok/s leaves
it, the server is saturated), and latency p50/p99 against the offered rate with the average
batch size on a second axis (batching should grow as the load grows, buying the throughput).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from batchserve.loadgen.config import LoadConfig
from batchserve.loadgen.report import LoadReport
from batchserve.loadgen.runner import LoadRun, run_load
from batchserve.loadgen.sender import Progress

__all__ = ["log_ticks", "plot_sweep", "run_sweep"]


def run_sweep(
    configs: Sequence[LoadConfig],
    *,
    pause_s: float = 1.0,
    on_run: Callable[[LoadRun], None] | None = None,
    progress: Callable[[LoadConfig], Callable[[Progress], None] | None] | None = None,
) -> list[LoadReport]:
    """Run each config in order (typically one per rate).

    Args:
        configs: the runs.
        pause_s: seconds to wait between runs, so the server drains (blocks).
        on_run: called after each run (to print it at once).
        progress: given each run's config, returns that run's progress callback.

    Returns:
        One report per config, in order.
    """
    reports: list[LoadReport] = []
    for i, cfg in enumerate(configs):
        if i and pause_s > 0:
            time.sleep(pause_s)
        run = run_load(cfg, on_progress=progress(cfg) if progress is not None else None)
        if on_run is not None:
            on_run(run)
        reports.append(run.report)
    return reports


def plot_sweep(reports: Sequence[LoadReport], path: str | Path, *, title: str = "") -> None:
    """Write a PNG of the sweep to ``path`` (matplotlib, no display needed)."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter
    except ImportError as exc:
        raise ImportError("--plot needs matplotlib: pip install 'batchserve[plot]'") from exc

    offered = [r.summary.offered_per_s for r in reports]
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    rates_ax, lat_ax = fig.subplots(1, 2)
    top = max([*offered, *(r.achieved_per_s for r in reports), 1.0])
    rates_ax.plot([0, top], [0, top], color="0.75", linestyle="--", label="offered")
    rates_ax.plot(offered, [r.achieved_per_s for r in reports], "o-", label="sent (achieved)")
    rates_ax.plot(offered, [r.summary.ok_per_s for r in reports], "s-", label="ok/s")
    rates_ax.set_xlabel("offered rate (requests/s)")
    rates_ax.set_ylabel("requests/s")
    rates_ax.set_title("throughput")
    rates_ax.legend(loc="upper left")
    rates_ax.grid(alpha=0.3)

    lat_ax.plot(offered, [r.summary.p50_ms for r in reports], "o-", label="p50")
    lat_ax.plot(offered, [r.summary.p99_ms for r in reports], "s-", label="p99")
    lat_ax.set_xlabel("offered rate (requests/s)")
    lat_ax.set_ylabel("latency from scheduled send (ms)")
    latencies = [v for r in reports for v in (r.summary.p50_ms, r.summary.p99_ms) if v > 0]
    if latencies:
        lat_ax.set_yscale("log")
        lo, hi = min(latencies), max(latencies)
        ticks = log_ticks(lo, hi)
        # The limits hold every tick, so a narrow range (5 to 23 ms) is labelled at
        # 5, 7, 10, 15, 20, 30 rather than at the one power of ten or 2x inside it.
        lat_ax.set_ylim(min(lo, ticks[0]) / 1.1, max(hi, ticks[-1]) * 1.1)
        lat_ax.yaxis.set_major_locator(FixedLocator(ticks))
        lat_ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        lat_ax.yaxis.set_minor_formatter(NullFormatter())
    lat_ax.set_title("latency and batch size")
    lat_ax.grid(alpha=0.3)
    batch_ax = lat_ax.twinx()
    batch_ax.plot(
        offered, [r.summary.avg_batch for r in reports], "^:", color="tab:green", label="batch"
    )
    batch_ax.set_ylabel("average batch size (items per forward pass)")
    batch_ax.set_ylim(bottom=0)
    lines = lat_ax.get_lines() + batch_ax.get_lines()
    lat_ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left")
    if title:
        fig.suptitle(title)
    fig.savefig(str(path), format="png", dpi=110)


#: Mantissas of the labelled ticks of a log axis, coarsest first.
_TICK_SETS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0))


def log_ticks(lo: float, hi: float, *, at_least: int = 4) -> list[float]:
    """Labelled ticks for a log axis spanning ``lo`` to ``hi`` (both > 0).

    The coarsest of 1-10-100, 1-2-5 and 1-1.5-2-3-5-7 (times powers of ten) that puts at
    least ``at_least`` ticks in the range, from the nearest tick at or below ``lo`` to the
    nearest at or above ``hi``; the finest when none does.
    """
    if lo <= 0 or hi < lo:
        raise ValueError(f"log_ticks needs 0 < lo <= hi, got {lo} and {hi}")
    first = math.floor(math.log10(lo)) - 1
    last = math.ceil(math.log10(hi)) + 1
    ticks: list[float] = []
    for mantissas in _TICK_SETS:
        every = sorted(float(f"{m * 10**e:.6g}") for e in range(first, last + 1) for m in mantissas)
        start = max(t for t in every if t <= lo)
        end = min(t for t in every if t >= hi)
        ticks = [t for t in every if start <= t <= end]
        if sum(lo <= t <= hi for t in ticks) >= at_least:
            break
    return ticks
