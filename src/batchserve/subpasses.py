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

The shape of the cost decides the cuts. On a CPU a pass's fixed cost is worth a few dozen
tokens, so the plan cuts often and computes almost only real tokens; on a GPU it is worth
thousands, so the plan keeps fewer, fuller sub-passes. The same function serves both: it is
handed the cost, it never measures.

:class:`PassCostModel` learns a :class:`PassCost` from measured passes: each observation is
a pass's sub-pass count, padded tokens, padded token-length products and its seconds, so an
engine can feed it one sub-pass at a time and a policy one whole pass. The fit is a
decayed least squares over those three features with every coefficient kept >= 0 (the
best fit over the subsets of the features whose solution is non-negative), rebuilt at each
observation (a 3x3 solve: once per pass, never per request). Until it has seen
``min_samples`` passes it answers its prior.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchserve.config import check_non_negative

__all__ = ["PassCost", "PassCostModel", "Shape", "padded_tokens", "plan", "predict_s", "shape"]


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
) -> list[list[int]]:
    """Cut a pass of items of these token counts into length-sorted sub-passes.

    Args:
        sizes: each item's tokens (special tokens included), in the pass's order.
        cost: what a sub-pass costs.
        max_items: at most this many items in a sub-pass (None: no bound).
        max_tokens: at most this many padded tokens in a sub-pass (None: no bound); an item
            alone is allowed even if it is longer.

    Returns:
        The sub-passes, shortest first, each a list of indices into ``sizes`` in ascending
        order of size (ties by index). Every index appears exactly once.
    """
    n = len(sizes)
    if n == 0:
        return []
    order = sorted(range(n), key=lambda i: (sizes[i], i))
    s = [max(1, int(sizes[i])) for i in order]
    cap = n if max_items is None else max(1, max_items)
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
        xx = np.array(self._xx)
        xy = np.array(self._xy)
        best: tuple[float, list[float]] | None = None
        for subset in _SUBSETS:
            idx = list(subset)
            a = xx[np.ix_(idx, idx)]
            # Scale so that features of very different magnitudes (1 vs n * L * L) solve well.
            scale = np.sqrt(np.maximum(np.diag(a), 1e-300))
            a_s = a / np.outer(scale, scale)
            if np.linalg.cond(a_s) > 1e10:
                continue
            coef = np.linalg.solve(a_s, xy[idx] / scale) / scale
            if (coef < 0).any():
                continue
            # The residual up to a constant: -2 b.Xy + b.XX.b (Syy is the same for all).
            sse = float(-2 * coef @ xy[idx] + coef @ a @ coef)
            if best is None or sse < best[0]:
                full = [0.0, 0.0, 0.0]
                for k, v in zip(idx, coef, strict=True):
                    full[k] = float(v)
                best = (sse, full)
        if best is None:
            return None
        fixed, per_token, attention = best[1]
        return PassCost(fixed_s=fixed, per_token_s=per_token, attention_s=attention)
