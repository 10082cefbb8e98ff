"""One pass as length-sorted sub-passes: the runner every engine's pass goes through.

Theory of operation
-------------------
An engine tokenizes a pass once, padded to its longest text, as it always did. Instead of
running that padded pass whole, it hands the features, each item's length (from the
attention mask) and its forward function to :meth:`SubPasses.run`, which:

1. plans the sub-passes with :func:`~batchserve.subpasses.plan` from the lengths and the
   engine's current :class:`~batchserve.subpasses.PassCost` (learned, see below), within
   :attr:`SubPasses.max_items` and :attr:`SubPasses.max_tokens` (memory: the attention
   scores of a sub-pass grow with ``n * L * L``);
2. runs each sub-pass on its rows of the features, with the columns cut to the sub-pass's
   longest. Padding is on the right (the tokenizer's side; a left-padding one is cut from
   the left), so the cut drops only padding columns: each item keeps its tokens, their
   positions and its mask, and its vector is the one the whole padded pass gives, to float
   rounding (cosine >= 0.9999, a tested property);
3. scatters each sub-pass's vectors back to their items' rows, so the answer is in the
   pass's order;
4. times each sub-pass's forward and teaches the engine's
   :class:`~batchserve.subpasses.PassCostModel` from it (under a lock: the server's workers
   run passes in parallel), so the next plan uses this machine's measured cost.

On an engine that compiles per shape (its runner's ``grid``: OpenVINO) the plan is made on
that :class:`~batchserve.subpasses.ShapeGrid`: each sub-pass runs at its longest item's length
rounded up to the grid, with one of the grid's item counts, its columns beyond the pass's
padding filled as the tokenizer pads (the pad token, mask 0), so the engine meets a bounded
set of shapes (:attr:`PassStatistics.shapes` counts those met).

A pass with one length (or one item) is one sub-pass and runs uncut. Everything a pass did
is counted (:meth:`SubPasses.statistics`): passes, sub-passes, real tokens, the tokens the
sub-passes computed, and those one padded pass would have computed.

Where the prior comes from (:func:`prior`): the cost model answers its prior until it has
seen :data:`WARMUP` sub-passes. On the CPU it is MiniLM-shaped (6 layers, 384 wide),
measured on a 2-core AMD EPYC (AVX-512, VNNI, BF16) with one thread while other work kept
it busy, by running 32 items of 16 and of 48 tokens as sub-passes of 1, 2, 4, 8 and 32 items
(``bench/pass_breakdown.py --fixed-cost``: the fixed cost is what the 1-item sub-passes
cost beyond the one 32-item pass, over 31): a token cost 300-650 us (int8 to torch
float32), a sub-pass 8 (ONNX int8) to 20-40 (float32, torch, OpenVINO) tokens' worth;
a fit over passes of 1-32 items of 8-256 tokens put the attention term at 0.4-0.7 us per
``n * L * L``. The prior is 400 us a token and 0.5 us of attention, both divided among
the threads, and 25 tokens' worth a sub-pass.
On a GPU the prior is what the built-in model's float32 engine learned on an H200 from
passes of one length, run eagerly (``bench/gpu/measure.py``, whose figures are
``docs/results/gpu_cost.json``): a sub-pass costs what several thousand tokens do (the
CPU issuing its kernels: the GPU idles between them), so the plan keeps fewer, fuller
sub-passes than on a CPU and cuts only for a long outlier. Replayed as CUDA graphs
(:mod:`batchserve.engines.cuda_graphs`) the fixed cost is a fraction of that; the
learned cost replaces the prior within a few passes either way.

What a plan is told a sub-pass costs is never less than :data:`MIN_FIXED_TOKENS` tokens'
worth of the learned per-token cost: on a busy machine the fit's fixed cost can read near
zero (it is small beside a large pass's noise), and a plan believing it would run every
length as its own sub-pass of one or two items, whose small matrix products run far below
the machine's rate (measured above: never less than 8 tokens' worth).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.subpasses import PassCost, PassCostModel, Shape, ShapeGrid, plan

__all__ = [
    "CPU_PRIOR",
    "GPU_PRIOR",
    "MAX_ITEMS",
    "MAX_TOKENS",
    "MIN_FIXED_TOKENS",
    "WARMUP",
    "PassStatistics",
    "SubPasses",
    "prior",
]

#: A one-thread CPU sub-pass of a MiniLM-sized encoder (see the module docstring).
CPU_PRIOR = PassCost(fixed_s=0.010, per_token_s=400e-6, attention_s=0.5e-6)
#: A GPU sub-pass, run eagerly: the CPU's launches dominate (see the module docstring).
GPU_PRIOR = PassCost(fixed_s=0.0075, per_token_s=1.0e-6, attention_s=1.3e-9)
#: Items in one sub-pass, at most: bounds the plan's work (it tries every group up to this
#: size: 0.09 ms for a pass of 32 items, 2.9 ms for 128, 16 ms for 512, in Python, holding
#: the GIL) and a GPU sub-pass's memory with short texts.
MAX_ITEMS = 128
#: Padded tokens in one sub-pass, at most (an item alone always goes): 8,192 tokens of 256
#: keep a MiniLM sub-pass's attention scores near 100 MB.
MAX_TOKENS = 8192

#: Sub-passes observed before the learned cost replaces the prior (a few passes' worth: the
#: first fits of a handful of noisy timings can be far off).
WARMUP = 16
#: A plan's fixed cost per sub-pass is at least this many tokens' worth (see above).
MIN_FIXED_TOKENS = 8

#: Runs one sub-pass on its features (rows sliced, columns cut): its vectors, a row each.
Forward = Callable[[dict[str, Any]], npt.NDArray[np.float32]]


def prior(device: str, threads: int = 1) -> PassCost:
    """The cost a new engine starts from on ``device`` with ``threads`` CPU threads a pass.

    On the CPU the per-token cost is divided among the threads (the fixed cost is not);
    anything else (``cuda:N``, ``mps``) takes the GPU's shape.
    """
    if device != "cpu":
        return GPU_PRIOR
    t = max(1, threads)
    return PassCost(
        fixed_s=CPU_PRIOR.fixed_s,
        per_token_s=CPU_PRIOR.per_token_s / t,
        attention_s=CPU_PRIOR.attention_s / t,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PassStatistics:
    """What an engine's passes computed, since it was loaded.

    Attributes:
        passes: passes run.
        subpasses: sub-passes run (>= passes).
        real_tokens: the items' own tokens (special tokens included).
        computed_tokens: tokens the sub-passes computed (each padded to its longest).
        unsplit_tokens: tokens the same passes would have computed whole (each padded to
            its longest item).
        cost: the cost the next plan uses (learned, or the prior).
        observed: sub-passes the cost was learned from.
        shapes: the distinct ``(items, width)`` sub-pass shapes run, on an engine planned
            on a grid (None on others: their shapes are not kept).
    """

    passes: int
    subpasses: int
    real_tokens: int
    computed_tokens: int
    unsplit_tokens: int
    cost: PassCost
    observed: int
    shapes: int | None = None

    @property
    def waste(self) -> float:
        """Tokens computed over real tokens (1.0: no padding computed); 1.0 before a pass."""
        return self.computed_tokens / self.real_tokens if self.real_tokens else 1.0

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values."""
        return {
            "passes": self.passes,
            "subpasses": self.subpasses,
            "real_tokens": self.real_tokens,
            "computed_tokens": self.computed_tokens,
            "unsplit_tokens": self.unsplit_tokens,
            "waste": round(self.waste, 4),
            "cost": {
                "fixed_s": self.cost.fixed_s,
                "per_token_s": self.cost.per_token_s,
                "attention_s": self.cost.attention_s,
            },
            "observed": self.observed,
            "shapes": self.shapes,
        }


class SubPasses:
    """Runs an engine's padded passes as length-sorted sub-passes (see the module docstring).

    Args:
        prior: the cost the plans use until the engine's own is learned (:func:`prior`).
        max_items: items per sub-pass, at most (None: no bound).
        max_tokens: padded tokens per sub-pass, at most (None: no bound).
        left_padded: the tokenizer pads on the left (cut the columns from the left).
        clock: what times a sub-pass (seconds; a test hands a manual one).
        grid: the sub-pass shapes the engine is given (None: any); right padding only.
        window: the model's window in tokens (caps the grid's rounding).
        pad_id: the tokenizer's pad token, for columns the grid adds past the padding.

    Thread-safe: passes may run in several threads at once; the cost model and the
    counters are updated under a lock, once per pass.
    """

    def __init__(
        self,
        prior: PassCost,
        *,
        max_items: int | None = MAX_ITEMS,
        max_tokens: int | None = MAX_TOKENS,
        left_padded: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        grid: ShapeGrid | None = None,
        window: int | None = None,
        pad_id: int = 0,
    ) -> None:
        for name, value in (("max_items", max_items), ("max_tokens", max_tokens)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if grid is not None and left_padded:
            raise ValueError("a shape grid pads on the right: a left-padded model has none")
        self.max_items = max_items
        self.max_tokens = max_tokens
        self.grid = grid
        self._window = window
        self._pad_id = pad_id
        self._shapes: set[tuple[int, int]] | None = set() if grid is not None else None
        self._left = left_padded
        self._clock = clock
        self._model = PassCostModel(prior, min_samples=WARMUP)
        self._lock = threading.Lock()
        self._passes = self._subpasses = 0
        self._real = self._computed = self._unsplit = 0

    @property
    def cost(self) -> PassCost:
        """The cost the next plan uses."""
        return self._model.estimate

    def plan(self, lengths: Sequence[int]) -> list[list[int]]:
        """The sub-passes a pass of items of these lengths runs as (indices, shortest first)."""
        cost = self._model.estimate
        floor = MIN_FIXED_TOKENS * cost.per_token_s
        if cost.fixed_s < floor:
            cost = PassCost(
                fixed_s=floor, per_token_s=cost.per_token_s, attention_s=cost.attention_s
            )
        return plan(
            lengths,
            cost,
            max_items=self.max_items,
            max_tokens=self.max_tokens,
            grid=self.grid,
            window=self._window,
        )

    def _longest(self, tokens: int) -> int:
        # The width a sub-pass whose longest item has ``tokens`` runs at.
        return tokens if self.grid is None else self.grid.width(tokens, self._window)

    def run(
        self, features: Mapping[str, Any], lengths: Sequence[int], forward: Forward
    ) -> npt.NDArray[np.float32]:
        """Run one padded pass as sub-passes; its vectors in the pass's order.

        Blocks for the forward passes (run it in a worker).

        Args:
            features: the tokenized pass: ``(items, width)`` arrays or tensors (numpy or
                torch: anything indexed as ``a[rows, :width]``), padded to ``width``;
                values of another shape pass through unchanged.
            lengths: each item's tokens (the attention mask's row sums), in order.
            forward: runs one sub-pass; returns one row per item of it.

        Returns:
            A float32 array, one row per item, in the order of ``features``.

        Raises:
            ValueError: the pass is empty, or ``features`` holds no ``(items, width)``
                attention mask or input ids.
        """
        n = len(lengths)
        if n == 0:
            raise ValueError("a pass must hold at least one item, got 0")
        clock = self._clock
        width = _width(features, n)
        groups = self.plan(lengths)
        if len(groups) == 1:
            # One sub-pass: the items in their own order, only the padding beyond the
            # longest (none, unless a bound or a truncation left some) cut.
            longest = self._longest(max(lengths))
            sub = (
                dict(features)
                if longest == width
                else _cut(features, None, n, width, longest, self._left, self._pad_id)
            )
            t0 = clock()
            out = np.asarray(forward(sub), dtype=np.float32)
            timed = [(n, longest, clock() - t0)]
        else:
            timed = []
            parts: list[tuple[list[int], npt.NDArray[np.float32]]] = []
            for rows in groups:
                longest = self._longest(max(lengths[i] for i in rows))
                sub = _cut(features, rows, n, width, longest, self._left, self._pad_id)
                t0 = clock()
                vectors = forward(sub)
                timed.append((len(rows), longest, clock() - t0))
                parts.append((rows, vectors))
            out = np.empty((n, parts[0][1].shape[1]), dtype=np.float32)
            for rows, vectors in parts:
                out[rows] = vectors
        real = sum(lengths)
        with self._lock:
            for k, longest, seconds in timed:
                self._model.observe(Shape(1, k * longest, k * longest * longest), seconds)
                self._computed += k * longest
                if self._shapes is not None:
                    self._shapes.add((k, longest))
            self._passes += 1
            self._subpasses += len(groups)
            self._real += real
            self._unsplit += n * width
        return out

    def statistics(self) -> PassStatistics:
        """A snapshot of what the passes computed and the cost they learned."""
        with self._lock:
            return PassStatistics(
                passes=self._passes,
                subpasses=self._subpasses,
                real_tokens=self._real,
                computed_tokens=self._computed,
                unsplit_tokens=self._unsplit,
                cost=self._model.estimate,
                observed=self._model.samples,
                shapes=len(self._shapes) if self._shapes is not None else None,
            )


def _width(features: Mapping[str, Any], n: int) -> int:
    """The padded width of the pass: the columns of its attention mask (or input ids)."""
    for name in ("attention_mask", "input_ids"):
        shape = getattr(features.get(name), "shape", None)
        if shape is not None and len(shape) == 2 and shape[0] == n:
            return int(shape[1])
    raise ValueError("features must hold an (items, width) attention_mask or input_ids")


def _cut(
    features: Mapping[str, Any],
    rows: list[int] | None,
    n: int,
    width: int,
    longest: int,
    left: bool,
    pad_id: int = 0,
) -> dict[str, Any]:
    """The features of ``rows`` (None: all) with their columns cut to ``longest``.

    A ``longest`` past ``width`` (a grid's rounding) adds columns on the right, as the
    tokenizer pads: ``input_ids`` the pad token, every other feature 0 (the mask hides them).
    """
    cols = slice(width - longest, width) if left else slice(0, longest)
    sub: dict[str, Any] = {}
    for name, value in features.items():
        shape = getattr(value, "shape", None)
        if shape is None or len(shape) != 2 or shape[0] != n or shape[1] != width:
            sub[name] = value
            continue
        part = value[:, cols] if rows is None else value[rows, cols]
        if longest > width:
            extra = np.full(
                (part.shape[0], longest - width),
                pad_id if name == "input_ids" else 0,
                dtype=np.asarray(part).dtype,
            )
            part = np.concatenate([np.asarray(part), extra], axis=1)
        sub[name] = part
    return sub
