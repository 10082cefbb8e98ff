"""Length-sorted sub-passes: where to cut a pass of padded items, by their tokens and the cost.

Theory of operation
-------------------
A transformer pads every item of a pass to the pass's longest, so a pass of short queries
and one long passage computes the passage's length for every query. Running the pass as
several **sub-passes**, each of items of similar length, computes far fewer padding tokens,
at the price of one more fixed cost (a kernel launch, reading the weights) per sub-pass.

:class:`PassCost` says what one sub-pass of ``n`` items padded to ``L`` tokens costs::

    seconds = fixed_s + per_token_s * n * L + attention_s * n * L * L

(the last term is attention's, which grows with the square of the length; it shows on long
texts). :func:`plan` sorts the items by tokens (ties by position, so the plan is a pure
function of the sizes) and cuts the sorted run where the total predicted cost is least:
a dynamic programme over the cut points, exact for contiguous groups of the sorted order,
which is where the optimum lies (moving a shorter item into a group of longer ones never
lowers the cost). ``max_items`` and ``max_tokens`` bound a sub-pass (memory); an item alone
is always allowed, however long.

An engine that compiles a kernel per shape it meets (OpenVINO: each new ``(n, L)`` costs a
few milliseconds the first time and a cache entry kept after) is planned on a
:class:`ShapeGrid`: a sub-pass's width is its longest item's length rounded up to the grid
(finer for short texts, where a padded token is a larger share), and its item count one of
the grid's counts (a group of another size is cut in two). So the shapes it ever meets are a
bounded set, met within its first minutes and kept (its memory levels off), and the plan
prices the padding the rounding adds.

The shape of the cost decides the cuts. On a CPU a pass's fixed cost is worth a few dozen
tokens, so the plan cuts often and computes almost only real tokens; on a GPU it is worth
thousands, so the plan keeps fewer, fuller sub-passes. The same function serves both: it is
handed the cost, it never measures.

:class:`PassCostModel` learns a :class:`PassCost` from measured passes: each observation is
a pass's sub-pass count, padded tokens, padded token-length products and its seconds, so an
engine can feed it one sub-pass at a time and a policy one whole pass. The fit is a
decayed least squares over those three features with every coefficient kept >= 0 (the
best fit over the subsets of the features whose solution is non-negative), rebuilt at each
observation (a 3x3 solve in plain Python, about a quarter of numpy's cost at these sizes:
once per pass, never per request). Until it has seen ``min_samples`` passes it answers
its prior.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from batchserve.config import check_non_negative

__all__ = [
    "GRID",
    "PassCost",
    "PassCostModel",
    "Shape",
    "ShapeGrid",
    "padded_tokens",
    "plan",
    "predict_s",
    "shape",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PassCost:
    """The cost of one sub-pass of ``n`` items padded to ``L`` tokens.

    Attributes:
        fixed_s: seconds per sub-pass, whatever its size.
        per_token_s: seconds per padded token (``n * L``).
        attention_s: seconds per padded token per token of its length (``n * L * L``).
    """

    fixed_s: float
    per_token_s: float
    attention_s: float = 0.0

    def __post_init__(self) -> None:
        check_non_negative("fixed_s", self.fixed_s)
        check_non_negative("per_token_s", self.per_token_s)
        check_non_negative("attention_s", self.attention_s)

    def seconds(self, n: int, longest: int) -> float:
        """Predicted seconds for one sub-pass of ``n`` items padded to ``longest`` tokens."""
        return self.fixed_s + n * longest * (self.per_token_s + self.attention_s * longest)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapeGrid:
    """The sub-pass shapes an engine that compiles per shape is planned on (a bounded set).

    Attributes:
        steps: ``(up_to, step)`` pairs, ascending: a length up to ``up_to`` tokens is rounded
            up to a multiple of ``step``; beyond the last, to a multiple of the last step.
        counts: the item counts a sub-pass may have, ascending, the first 1 (so any group
            can be cut into allowed ones).
    """

    steps: tuple[tuple[int, int], ...]
    counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.steps or any(step < 1 or top < 1 for top, step in self.steps):
            raise ValueError(f"steps must be (up_to, step) pairs >= 1, got {self.steps!r}")
        if list(self.steps) != sorted(self.steps):
            raise ValueError(f"steps must be ascending, got {self.steps!r}")
        if not self.counts or self.counts[0] != 1 or list(self.counts) != sorted(set(self.counts)):
            raise ValueError(f"counts must ascend from 1 without repeats, got {self.counts!r}")

    def width(self, tokens: int, limit: int | None = None) -> int:
        """The width a sub-pass whose longest item has ``tokens`` tokens runs at.

        ``limit`` (the model's window) caps the rounding, never the item: a width is at
        least ``tokens``.
        """
        step = self.steps[-1][1]
        for top, s in self.steps:
            if tokens <= top:
                step = s
                break
        rounded = -(-tokens // step) * step
        if limit is not None:
            rounded = min(rounded, max(limit, tokens))
        return rounded

    def allowed(self, limit: int) -> list[bool]:
        """``allowed[k]``: whether a sub-pass may hold ``k`` items, for ``k <= limit``."""
        ok = [False] * (limit + 1)
        for c in self.counts:
            if c <= limit:
                ok[c] = True
        return ok

    def size(self, window: int, max_items: int) -> int:
        """How many shapes the grid holds for texts up to ``window`` tokens."""
        widths = {self.width(t, window) for t in range(1, window + 1)}
        return len(widths) * sum(1 for c in self.counts if c <= max_items)


#: The grid OpenVINO's sub-passes are planned on: lengths to a multiple of 4 up to 64 tokens,
#: then of 8, 16, 32, 64 (at most 3 padded tokens up to 64, an eighth past it); counts about
#: 1.5x apart. 32 widths by 10 counts for a 256-token window and passes of 32.
GRID = ShapeGrid(
    steps=((64, 4), (128, 8), (256, 16), (512, 32), (1024, 64)),
    counts=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128),
)


@dataclass(frozen=True, slots=True)
class Shape:
    """What a planned pass computes: its sub-passes, padded tokens and their squares.

    Attributes:
        subpasses: how many sub-passes.
        tokens: padded tokens over all of them (``sum n * L``).
        tokens_sq: ``sum n * L * L``, the attention term's feature.
    """

    subpasses: int
    tokens: int
    tokens_sq: int


def plan(
    sizes: Sequence[int],
    cost: PassCost,
    *,
    max_items: int | None = None,
    max_tokens: int | None = None,
    grid: ShapeGrid | None = None,
    window: int | None = None,
) -> list[list[int]]:
    """Cut a pass of items of these token counts into length-sorted sub-passes.

    Args:
        sizes: each item's tokens (special tokens included), in the pass's order.
        cost: what a sub-pass costs.
        max_items: at most this many items in a sub-pass (None: no bound).
        max_tokens: at most this many padded tokens in a sub-pass (None: no bound); an item
            alone is allowed even if it is longer.
        grid: the shapes a sub-pass may have (None: any): its width is priced as
            :meth:`ShapeGrid.width` of its longest, and its item count one of the grid's.
        window: the model's window, capping the grid's rounding.

    Returns:
        The sub-passes, shortest first, each a list of indices into ``sizes`` in ascending
        order of size (ties by index). Every index appears exactly once.
    """
    n = len(sizes)
    if n == 0:
        return []
    order = sorted(range(n), key=lambda i: (sizes[i], i))
    s = [max(1, int(sizes[i])) for i in order]
    if grid is not None:  # rounding is monotone: the sorted order is the widths' order
        s = [grid.width(x, window) for x in s]
    cap = n if max_items is None else max(1, max_items)
    allowed = grid.allowed(min(n, cap)) if grid is not None else None
    budget = math.inf if max_tokens is None else max_tokens
    fixed, per_token, attention = cost.fixed_s, cost.per_token_s, cost.attention_s
    best = [0.0] * (n + 1)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = s[j - 1]
        per_item = longest * (per_token + attention * longest)
        # The group (i, j] of the sorted run: the longest is its last. Wider groups are
        # tried from j-1 down; a bound stops the search (a wider group only grows).
        lo = max(0, j - cap)
        top = j - 1
        value = best[top] + fixed + per_item
        where = top
        for i in range(top - 1, lo - 1, -1):
            k = j - i
            if k * longest > budget:
                break
            if allowed is not None and not allowed[k]:
                continue
            c = best[i] + fixed + k * per_item
            if c < value:
                value, where = c, i
        best[j] = value
        cut[j] = where
    groups: list[list[int]] = []
    j = n
    while j > 0:
        i = cut[j]
        groups.append(order[i:j])
        j = i
    groups.reverse()
    return groups


def shape(sizes: Sequence[int], groups: Sequence[Sequence[int]]) -> Shape:
    """The sub-passes, padded tokens and ``sum n * L * L`` of ``groups`` over ``sizes``."""
    tokens = tokens_sq = 0
    for g in groups:
        longest = max(max(1, int(sizes[i])) for i in g)
        tokens += len(g) * longest
        tokens_sq += len(g) * longest * longest
    return Shape(len(groups), tokens, tokens_sq)


def padded_tokens(sizes: Sequence[int], groups: Sequence[Sequence[int]]) -> int:
    """Tokens computed by the sub-passes ``groups`` (each padded to its longest)."""
    return shape(sizes, groups).tokens


def predict_s(shape_: Shape, cost: PassCost) -> float:
    """Predicted seconds of a pass of this shape at this cost."""
    return (
        shape_.subpasses * cost.fixed_s
        + shape_.tokens * cost.per_token_s
        + shape_.tokens_sq * cost.attention_s
    )


#: The subsets of the three features (fixed, per token, attention) tried by the fit.
_SUBSETS = [c for r in (3, 2, 1) for c in itertools.combinations(range(3), r)]


class PassCostModel:
    """A :class:`PassCost` learned online from measured passes (see the module docstring).

    Args:
        prior: the cost answered until ``min_samples`` passes are seen.
        decay: weight kept by past observations at each new one, in (0, 1].
        min_samples: passes seen before the fit replaces the prior.

    Attributes:
        estimate: the current cost (read-only: only ``observe`` changes it).
        samples: passes observed.

    Not thread-safe: one owner feeds it (an engine's passes run in several threads: it
    observes under its own lock).
    """

    def __init__(self, prior: PassCost, *, decay: float = 0.98, min_samples: int = 4) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self._decay = decay
        self._min = min_samples
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xy = [0.0] * 3
        self.estimate = prior
        self.samples = 0

    def observe(self, shape_: Shape, seconds: float) -> None:
        """Add one measured pass of this shape that took ``seconds``."""
        if shape_.subpasses <= 0 or seconds < 0:
            return
        d = self._decay
        x = (float(shape_.subpasses), float(shape_.tokens), float(shape_.tokens_sq))
        for a in range(3):
            self._xy[a] = self._xy[a] * d + x[a] * seconds
            row = self._xx[a]
            for b in range(3):
                row[b] = row[b] * d + x[a] * x[b]
        self.samples += 1
        if self.samples >= self._min:
            fitted = self._fit()
            if fitted is not None:
                self.estimate = fitted

    def _fit(self) -> PassCost | None:
        # Plain Python: a 3x3 system solved seven times is ~20x cheaper than with numpy's
        # calls (this runs at every observation, on the engine's thread and the policy's).
        xx, xy = self._xx, self._xy
        best: tuple[float, list[float]] | None = None
        for idx in _SUBSETS:
            # Scale so that features of very different magnitudes (1 vs n * L * L) solve well.
            scale = [math.sqrt(max(xx[i][i], 1e-300)) for i in idx]
            a = [
                [xx[i][j] / (scale[r] * scale[c]) for c, j in enumerate(idx)]
                for r, i in enumerate(idx)
            ]
            if _condition(a) > 1e10:
                continue
            solved = _solve(a, [xy[i] / scale[r] for r, i in enumerate(idx)])
            if solved is None:
                continue
            coef = [x / scale[r] for r, x in enumerate(solved)]
            if min(coef) < 0:
                continue
            # The residual up to a constant: -2 b.Xy + b.XX.b (Syy is the same for all).
            sse = -2 * sum(coef[r] * xy[i] for r, i in enumerate(idx)) + sum(
                coef[r] * xx[i][j] * coef[c] for r, i in enumerate(idx) for c, j in enumerate(idx)
            )
            if best is None or sse < best[0]:
                full = [0.0, 0.0, 0.0]
                for r, i in enumerate(idx):
                    full[i] = coef[r]
                best = (sse, full)
        if best is None:
            return None
        fixed, per_token, attention = best[1]
        return PassCost(fixed_s=fixed, per_token_s=per_token, attention_s=attention)


def _condition(a: list[list[float]]) -> float:
    """The 2-norm condition number of a symmetric positive semi-definite 1..3 square matrix."""
    k = len(a)
    if k == 1:
        return 1.0 if a[0][0] > 0 else math.inf
    if k == 2:
        half = (a[0][0] + a[1][1]) / 2
        gap = math.hypot((a[0][0] - a[1][1]) / 2, a[0][1])
        hi, lo = half + gap, half - gap
    else:
        # Eigenvalues of a symmetric 3x3 matrix in closed form (the trigonometric method).
        off = a[0][1] ** 2 + a[0][2] ** 2 + a[1][2] ** 2
        q = (a[0][0] + a[1][1] + a[2][2]) / 3
        if off == 0:
            diag = (a[0][0], a[1][1], a[2][2])
            hi, lo = max(diag), min(diag)
        else:
            p = math.sqrt(
                ((a[0][0] - q) ** 2 + (a[1][1] - q) ** 2 + (a[2][2] - q) ** 2 + 2 * off) / 6
            )
            b = [[(a[r][c] - (q if r == c else 0.0)) / p for c in range(3)] for r in range(3)]
            det = (
                b[0][0] * (b[1][1] * b[2][2] - b[1][2] * b[2][1])
                - b[0][1] * (b[1][0] * b[2][2] - b[1][2] * b[2][0])
                + b[0][2] * (b[1][0] * b[2][1] - b[1][1] * b[2][0])
            )
            phi = math.acos(max(-1.0, min(1.0, det / 2))) / 3
            hi = q + 2 * p * math.cos(phi)
            lo = q + 2 * p * math.cos(phi + 2 * math.pi / 3)
    return math.inf if lo <= 0 else hi / lo


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """``x`` with ``a x = b`` (Gaussian elimination, partial pivoting); None if singular."""
    k = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        if m[pivot][col] == 0:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, k):
            f = m[r][col] / m[col][col]
            for c in range(col, k + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * k
    for r in range(k - 1, -1, -1):
        x[r] = (m[r][k] - sum(m[r][c] * x[c] for c in range(r + 1, k))) / m[r][r]
    return x
