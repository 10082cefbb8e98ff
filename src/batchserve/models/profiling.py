"""A model's cost curve, measured: ``t(n) = fixed_s + n * per_item_s`` fitted to timed passes.

Theory of operation
-------------------
:func:`measure` runs the model on batches of each size in turn (after a warm-up pass, which
pays first-call costs such as allocations and lazy initialisation), ``repeats`` times each,
and keeps the median time per size: a stray slow pass (a page fault, a neighbour on the CPU)
moves a median little. :func:`fit_line` fits a straight line to the medians by ordinary
least squares and reports how well it fits: R squared, and the worst relative residual
``|measured - fitted| / measured``. Both coefficients are kept >= 0 (a negative one is set to
0 and the other refitted), as a cost is never negative.

A :class:`Profile` is saved as JSON (:func:`save_profile`); :func:`load_profile` reads the
cost estimate back, for ``simulate``, ``tune`` and ``serve --profile`` (as the cost model's
starting estimate). The file::

    {"model": "synthetic:fixed=8ms,per_item=0.25ms", "fixed_s": 0.00806,
     "per_item_s": 0.000251, "r_squared": 0.9999, "max_rel_residual": 0.004,
     "points": [[1, 0.00831], [2, 0.00856], ...], "repeats": 5,
     "created": "2026-11-29T09:30:00+00:00"}

Timing uses a wall-clock timer (``time.perf_counter`` by default): profiling measures the
model itself and is no part of the batching engine, which reads time only through its clock.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from batchserve.config import CostEstimate
from batchserve.errors import ConfigError
from batchserve.models.base import AsyncBatchFn, BatchFn, SyncBatchFn, is_async_model

__all__ = [
    "Fit",
    "Profile",
    "default_sizes",
    "fit_line",
    "load_profile",
    "measure",
    "profile_model",
    "read_profile",
    "sample_inputs",
    "save_profile",
]

_TEXT = (
    "the quick brown fox jumps over the lazy dog while a batching server groups "
    "requests that arrive close together and runs them through the model in one pass"
)
_WORDS = _TEXT.split(" ")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """A straight line fitted to ``(batch size, seconds)`` points.

    Attributes:
        fixed_s: the intercept: seconds paid once per pass.
        per_item_s: the slope: seconds added by each item.
        r_squared: 1 - residual sum of squares / total sum of squares (1.0 is a perfect fit).
        max_rel_residual: the worst ``|measured - fitted| / measured`` over the points.
    """

    fixed_s: float
    per_item_s: float
    r_squared: float
    max_rel_residual: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A model's measured cost curve and its fit.

    Attributes:
        model: the model SPEC that was profiled.
        fixed_s: fitted seconds per pass.
        per_item_s: fitted seconds per item.
        r_squared: the fit's R squared.
        max_rel_residual: the fit's worst relative residual.
        points: ``(batch size, median seconds)`` for each size measured.
        repeats: timed passes per size.
        created: when it was measured, ISO 8601 in UTC.
    """

    model: str
    fixed_s: float
    per_item_s: float
    r_squared: float
    max_rel_residual: float
    points: tuple[tuple[int, float], ...]
    repeats: int
    created: str

    @property
    def cost(self) -> CostEstimate:
        """The fitted cost model."""
        return CostEstimate(fixed_s=self.fixed_s, per_item_s=self.per_item_s)

    def to_dict(self) -> dict[str, Any]:
        """The JSON file's content."""
        return {
            "model": self.model,
            "fixed_s": self.fixed_s,
            "per_item_s": self.per_item_s,
            "r_squared": self.r_squared,
            "max_rel_residual": self.max_rel_residual,
            "points": [[n, s] for n, s in self.points],
            "repeats": self.repeats,
            "created": self.created,
        }

    @classmethod
    def from_dict(cls, data: object, *, source: str = "profile") -> Profile:
        """Validate and build a profile from its JSON content.

        Raises:
            ConfigError: a field is missing or of the wrong type; the message names it.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{source} must be a JSON object, got {type(data).__name__}")

        def number(key: str) -> float:
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{source}: {key} must be a number, got {value!r}")
            return float(value)

        raw_points = data.get("points", [])
        if not isinstance(raw_points, list) or not all(
            isinstance(p, list) and len(p) == 2 for p in raw_points
        ):
            raise ConfigError(f"{source}: points must be a list of [size, seconds] pairs")
        try:
            cost = CostEstimate(fixed_s=number("fixed_s"), per_item_s=number("per_item_s"))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        return cls(
            model=str(data.get("model", "")),
            fixed_s=cost.fixed_s,
            per_item_s=cost.per_item_s,
            r_squared=number("r_squared") if "r_squared" in data else math.nan,
            max_rel_residual=(
                number("max_rel_residual") if "max_rel_residual" in data else math.nan
            ),
            points=tuple((int(n), float(s)) for n, s in raw_points),
            repeats=int(data.get("repeats", 0)),
            created=str(data.get("created", "")),
        )


def default_sizes(max_batch_size: int) -> list[int]:
    """Batch sizes to measure: every size up to 8, then steps of about 25%, then the max.

    Raises:
        ConfigError: ``max_batch_size`` is < 1.
    """
    if max_batch_size < 1:
        raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
    sizes = list(range(1, min(8, max_batch_size) + 1))
    n = 8
    while n < max_batch_size:
        n = max(n + 1, round(n * 1.25))
        sizes.append(min(n, max_batch_size))
    return sorted(set(sizes))


def sample_inputs(count: int, *, words: int = 12, lines: Sequence[str] = ()) -> list[str]:
    """``count`` input texts: the given ``lines`` in turn, or sentences of ``words`` words."""
    if lines:
        return [lines[i % len(lines)] for i in range(count)]
    return [
        " ".join(_WORDS[(i + j) % len(_WORDS)] for j in range(words)) + f" #{i}"
        for i in range(count)
    ]


def measure(
    fn: BatchFn,
    sizes: Sequence[int],
    *,
    repeats: int = 5,
    inputs: Sequence[Any] | None = None,
    warmup: int = 1,
    timer: Callable[[], float] = time.perf_counter,
) -> list[tuple[int, float]]:
    """Time the model at each batch size; the median of ``repeats`` passes per size.

    Blocks for the whole measurement. An async model runs on a private event loop.

    Args:
        fn: the batch function (sync or async).
        sizes: batch sizes to measure, each >= 1.
        repeats: timed passes per size (>= 1).
        inputs: at least ``max(sizes)`` inputs (default: :func:`sample_inputs`).
        warmup: untimed passes at the largest size first.
        timer: the time source, seconds.

    Returns:
        ``(size, median seconds)`` per size, in the order given.

    Raises:
        ConfigError: ``repeats`` < 1, a size < 1, or too few inputs.
    """
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"sizes must be a non-empty list of integers >= 1, got {list(sizes)}")
    top = max(sizes)
    data = list(inputs) if inputs is not None else sample_inputs(top)
    if len(data) < top:
        raise ConfigError(
            f"inputs must hold at least {top} items (the largest size), got {len(data)}"
        )
    loop = asyncio.new_event_loop() if is_async_model(fn) else None
    try:

        def run(batch: list[Any]) -> None:
            if loop is not None:
                loop.run_until_complete(_call_async(cast(AsyncBatchFn, fn), batch))
            else:
                cast(SyncBatchFn, fn)(batch)

        for _ in range(warmup):
            run(data[:top])
        points = []
        for n in sizes:
            batch = data[:n]
            times = []
            for _ in range(repeats):
                t0 = timer()
                run(batch)
                times.append(timer() - t0)
            points.append((n, statistics.median(times)))
        return points
    finally:
        if loop is not None:
            loop.close()


async def _call_async(fn: AsyncBatchFn, batch: list[Any]) -> None:
    await fn(batch)


def fit_line(points: Sequence[tuple[int, float]]) -> Fit:
    """Least-squares fit of ``seconds = fixed_s + n * per_item_s``, both kept >= 0.

    Raises:
        ConfigError: no points.
    """
    if not points:
        raise ConfigError("points must not be empty")
    xs = [float(n) for n, _ in points]
    ys = [s for _, s in points]
    k = len(xs)
    mx = sum(xs) / k
    my = sum(ys) / k
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx if sxx > 0 else 0.0
    a = my - b * mx
    if b < 0:
        a, b = max(0.0, my), 0.0
    if a < 0:
        sxx0 = sum(x * x for x in xs)
        a, b = 0.0, max(0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sxx0)
    fitted = [a + b * x for x in xs]
    ss_res = sum((y - f) ** 2 for y, f in zip(ys, fitted, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    # A flat curve (every size costs the same) is fitted perfectly by a zero slope.
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float(ss_res == 0)
    worst = max(
        (abs(y - f) / y if y > 0 else (0.0 if f == 0 else math.inf))
        for y, f in zip(ys, fitted, strict=True)
    )
    return Fit(fixed_s=a, per_item_s=b, r_squared=r2, max_rel_residual=worst)


def profile_model(
    fn: BatchFn,
    *,
    model: str,
    sizes: Sequence[int],
    repeats: int = 5,
    inputs: Sequence[Any] | None = None,
    warmup: int = 1,
    timer: Callable[[], float] = time.perf_counter,
) -> Profile:
    """Measure the model (:func:`measure`) and fit its cost curve (:func:`fit_line`).

    Args:
        fn: the batch function.
        model: its SPEC, recorded in the profile.
        sizes: batch sizes to measure.
        repeats: timed passes per size.
        inputs: the inputs to batch (default: :func:`sample_inputs`).
        warmup: untimed passes first.
        timer: the time source.
    """
    points = measure(fn, sizes, repeats=repeats, inputs=inputs, warmup=warmup, timer=timer)
    fit = fit_line(points)
    return Profile(
        model=model,
        fixed_s=fit.fixed_s,
        per_item_s=fit.per_item_s,
        r_squared=fit.r_squared,
        max_rel_residual=fit.max_rel_residual,
        points=tuple(points),
        repeats=repeats,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write the profile as JSON to ``path``."""
    data = profile.to_dict()
    # One key per line, and one line for the points, so the file reads well in a diff.
    body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items())
    Path(path).write_text("{\n" + body + "\n}\n", encoding="utf-8")


def read_profile(path: str | Path) -> Profile:
    """Read a profile written by :func:`save_profile` (or ``batchserve profile``).

    Raises:
        ConfigError: the file cannot be read, is not JSON, or lacks ``fixed_s``/``per_item_s``.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"profile {str(path)!r} cannot be read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"profile {str(path)!r} is not valid JSON: {exc}") from None
    return Profile.from_dict(data, source=f"profile {str(path)!r}")


def load_profile(path: str | Path) -> CostEstimate:
    """The cost estimate stored in a profile file: what ``serve --profile`` starts from.

    Raises:
        ConfigError: as :func:`read_profile`.
    """
    return read_profile(path).cost
