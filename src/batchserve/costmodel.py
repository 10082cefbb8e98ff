"""The cost model ``t(n) = fixed_s + n * per_item_s``, fitted online from finished batches.

Theory of operation: every finished forward pass adds one observation ``(n, seconds)``. The
fit is weighted least squares over exponentially decayed sums (each new observation multiplies
the old weights by ``decay``), so the model follows a model whose speed drifts (a warm cache,
a slow pass, a recovery) with a memory of about ``1 / (1 - decay)`` batches.

It also tracks ``spread_s``, the root-mean-square error of its own predictions (each pass
predicted before it is learned from, exponentially decayed like the fit), so admission can
leave a margin for the noise of a real machine.

Until the first observation, the stated starting estimate is used. While every observation
has (nearly) the same batch size the slope cannot be fitted; the slope of the starting
estimate is kept and only the fixed cost is fitted. Both coefficients are kept >= 0.
"""

from __future__ import annotations

from batchserve.config import CostEstimate

__all__ = ["CostModel"]


class CostModel:
    """Online least-squares fit of ``fixed_s + n * per_item_s``.

    Args:
        initial: the estimate used before any batch is measured.
        decay: weight kept by past observations at each new one, in (0, 1].

    Attributes:
        estimate: the current fitted coefficients (read-only: only ``observe`` changes it).
        spread_s: root-mean-square error of the model's recent predictions, in seconds
            (read-only, like ``estimate``).
        samples: passes observed.

    ``estimate`` and ``spread_s`` are read at every admission, so they are plain attributes
    that ``observe`` updates, not properties computed on each read.
    """

    __slots__ = (
        "_decay",
        "_initial",
        "_s0",
        "_s1",
        "_s2",
        "_sny",
        "_sq",
        "_sy",
        "estimate",
        "samples",
        "spread_s",
    )

    def __init__(self, initial: CostEstimate, *, decay: float = 0.97) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self._initial = initial
        self._decay = decay
        self._s0 = self._s1 = self._s2 = self._sy = self._sny = self._sq = 0.0
        self.estimate = initial
        self.spread_s = 0.0
        self.samples = 0

    def cost(self, n: int) -> float:
        """Predicted seconds for a forward pass of ``n`` items."""
        est = self.estimate
        return est.fixed_s + n * est.per_item_s

    def observe(self, n: int, seconds: float) -> None:
        """Add one finished forward pass of ``n`` items that took ``seconds``."""
        if n <= 0 or seconds < 0:
            return
        d = self._decay
        if self.samples > 0:
            err = seconds - self.cost(n)
            self._sq = self._sq * d + err * err
        self._s0 = self._s0 * d + 1.0
        self._s1 = self._s1 * d + n
        self._s2 = self._s2 * d + n * n
        self._sy = self._sy * d + seconds
        self._sny = self._sny * d + n * seconds
        self.samples += 1
        self.estimate = self._fit()
        self.spread_s = (self._sq / self._s0) ** 0.5

    def _fit(self) -> CostEstimate:
        s0, s1, s2, sy, sny = self._s0, self._s1, self._s2, self._sy, self._sny
        var = s0 * s2 - s1 * s1
        if var > 1e-9 * s0 * s2:
            b = (s0 * sny - s1 * sy) / var
            a = (sy - b * s1) / s0
        else:
            b = self._initial.per_item_s
            a = (sy - b * s1) / s0
        if b < 0.0:
            b, a = 0.0, sy / s0
        if a < 0.0:
            a, b = 0.0, sny / s2
        return CostEstimate(fixed_s=a, per_item_s=b)
