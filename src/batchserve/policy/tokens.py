"""Batches formed by tokens: a pass costs its length-sorted sub-passes.

Theory of operation
-------------------
:class:`ByTokens` is the pricing (:mod:`batchserve.policy.parts`) of a
:class:`~batchserve.policy.core.Policy` for a model whose inputs are padded to the longest
of their forward call (a transformer) and which runs a pass as **length-sorted sub-passes**
(:mod:`batchserve.subpasses`: the items sorted by tokens and cut where a fixed cost per
sub-pass is worth less than the padding it saves). Each entry carries its ``size`` in tokens
(``offer(now, payload, deadline, size)``), and a pass costs its sub-passes: ``fixed_s``
each, plus ``per_token_s`` per padded token and ``attention_s`` per padded token per token
of its length (a :class:`~batchserve.subpasses.PassCost`). So the pricing changes three
things, whatever the queue's discipline.

* **The cost in tokens.** ``token_cost`` is a :class:`~batchserve.subpasses.PassCostModel`.
  At dispatch the policy plans the pass as the engine will (:func:`~batchserve.subpasses.plan`
  on the entries' sizes with its current estimate) and keeps the plan's
  :class:`~batchserve.subpasses.Shape` (sub-passes, padded tokens, their squares) and its
  predicted seconds; at ``finish`` the model learns that shape against the measured
  ``now - batch.start``. The shape is the policy's plan, not the engine's own (which
  counts the tokenizer's tokens and plans with its own estimate of one sub-pass): the fit
  absorbs the difference, and what the driver adds to a pass, into its three terms, which
  is what admission needs (the time a pass of these items holds a worker).

  A plan depends on the estimate, and the estimate on the plans it was fitted on: when the
  estimate moves enough that a plan may cut elsewhere (the fixed cost in tokens by 1.5x),
  the last 16 passes are re-planned and fitted again, from the current estimate and from
  passes run whole, and the fit that predicts them best is kept, the model as it was
  included (at most once in 12 passes; ``_refit``). From the zero prior a GPU-shaped cost
  took about 800 passes to learn without it, and past saturation it settled on a fit that
  cut where the engine does not (each pass's prediction -25% to +13%); with it the fit is
  exact after 5 passes in the simulator.
* **What admission predicts.** A running pass ends at its start plus its own predicted
  seconds (it was planned at dispatch). A queued pass, as the plain policy's ``fixed +
  n * per_item``, with figures derived at each finish, never per admission: a *typical
  full pass*, ``max_batch_size`` sizes at evenly spaced quantiles of the last ``4 *
  max_batch_size`` dispatched items, is planned with the estimate (again every 16 passes,
  or when the estimate moves); ``fixed`` is one sub-pass, and ``per_item`` is the rest of
  that pass's seconds per item, split into its
  extra sub-passes' share, a part linear in an item's tokens and the attention part,
  quadratic. At admission the two token parts are scaled by the mean tokens of the queued
  items (the policy counts them as items come and go), so a queue of long texts refuses
  sooner than a queue of short ones; that is three multiplications. The margin uses the
  token model's own prediction error (each pass predicted before it is learned from).
  Until the token model has fitted ``_MIN_PASSES`` passes the item model (the plain
  policy's) is used.
* **Which items go** (``group``). The oldest queued item always goes, and when a pass goes is
  the plain policy's rule: when it is full or the oldest item has waited ``max_wait_s``. The
  rest of the pass is taken from the oldest ``length_window * max_batch_size`` queued items,
  oldest first, skipping any item that would break a bound (``max_batch_size`` items,
  ``max_batch_tokens`` padded tokens, longest x count: an upper bound of what the sorted
  sub-passes compute, so a bound on the memory of any of them) or that **the engine would
  not run in the same sub-pass** as the pass's items: one sub-pass of them all must cost no
  more, by the token model, than the pass without it plus a sub-pass of its own. The oldest
  goes even if it alone is over ``max_batch_tokens``.

  The rule is the one that kept a long passage out of a short query's pass when a pass was
  padded whole (an item joined if it added no more padded tokens than it would cost alone,
  its tokens plus the fixed cost in tokens), re-derived for sorted passes: for two groups
  the two conditions are the same inequality, ``k * (L_new - L) <= fixed / per_token``, so a
  pass now holds what one sub-pass would. Its reason changed. A long item in a sorted pass
  costs only its own sub-pass, never more than a pass of its own, so the rule no longer
  saves work (the waste is the same with and without it); it decides which items wait for
  which: every item of a pass is answered when the pass ends, so a short query in a pass
  of mixed lengths waits for the long passages' sub-passes. On a CPU, where a sub-pass's
  fixed cost is worth a few dozen tokens, passes are short and of one length; on a GPU,
  where it is worth thousands, everything joins, as by count. It was measured in the
  simulator against taking the oldest items in order (``sim.simulate`` with the true
  sub-pass cost and 1 ms of driver overhead a pass; the paragraphs of the Python manual,
  ``reference_paragraphs()``, 1,863 of 40 tokens mean, 29 median, 87 at p90 by the
  built-in estimate, one per request, Poisson, ``max_batch_size`` 32, 1 s deadline; rates
  as a fraction of the saturated ok/s)::

      cost                          load   ok/s in order / rule   p50 ms        p99 ms
      CPU: 5 ms + 250 us/token      0.5x   33.9 / 33.9            30.3 / 27.9   392 / 311
           + 0.5 us/token^2         0.8x   54.7 / 54.7            97.8 / 71.9   735 / 539
                                    1.5x   71.4 / 74.6             696 / 356    966 / 789
      GPU: 4 ms + 0.5 us/token      0.5x   2143 / 2143             8.7 / 8.7   12.5 / 12.5
                                    1.5x   4282 / 4282             251 / 251    261 / 261

  The same throughput (4% more past saturation), and on a CPU 8% to half off p50 and a
  fifth to a quarter off p99 (the passes are 4x as many and as short); on a GPU it changes
  nothing (everything joins). So it stays. Until the token model has a fit with both a
  fixed and a token term (before ``_MIN_PASSES`` passes, or passes too alike to tell them
  apart) every item joins.

  No item is starved: every pass takes the oldest, so an item waits at most as many passes
  as there are items ahead of it, and in practice a few: the items ahead of it of other
  lengths go in passes of their own, in order of age. Deadlines are kept by admission,
  above, and a pass bounded by ``max_batch_tokens`` keeps the wait behind one pass short.

  With classes of work (:class:`~batchserve.policy.mixed.Classes`) the candidates are the
  classes' shares, not the oldest window, and the same group decides which join: the first
  item each class gives a pass joins whatever its tokens (as the oldest does here), so no
  class waits on the others' lengths and none is starved; the others join as above.
* **When a pass is full.** Also when the queued items hold ``max_batch_tokens`` tokens.

Counted for the statistics: the padded tokens of every dispatched pass's planned sub-passes
and the real tokens (their ratio is the padding waste).

What it costs the driver, measured on this 2-core machine (busy): about 0.85 ms of event
loop a pass of 32 items beyond the plain policy's (the plan at dispatch, 250 us; the fit,
260 us), nothing per admission beyond the plain policy's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection
from typing import Generic

from batchserve.config import BatchConfig
from batchserve.costmodel import CostModel
from batchserve.policy.entries import Batch, Entry, PayloadT
from batchserve.policy.outcomes import TokenStats
from batchserve.subpasses import PassCost, PassCostModel, Shape, plan, predict_s, shape

__all__ = ["ByTokens"]

#: Passes the token model is fitted on before admission predicts with it.
_MIN_PASSES = 4
#: Weight kept by the token model's squared prediction error at each pass (its spread).
_SPREAD_DECAY = 0.97
#: Recent dispatched items whose sizes describe a typical pass, in passes of max_batch_size.
_WINDOW_PASSES = 4
#: Recent passes re-planned when the estimate moves, and at most how many rounds of it.
_REFIT_PASSES = 16
_REFIT_ROUNDS = 2
#: At most one refit in this many passes (a refit plans its window several times over).
_REFIT_EVERY = 12
#: The typical pass is re-planned at least this often (in passes), as recent sizes drift.
_TYPICAL_EVERY = 16
#: A cost whose plan never cuts: the start of the rounds that assume passes run whole.
_WHOLE = PassCost(fixed_s=1.0, per_token_s=0.0)
#: The estimate has moved (see ``_moved``) when the fixed cost in tokens moves by more
#: than this factor (and half a token), or attention's share of a token's cost at
#: ``_REFERENCE`` tokens by more than 0.1: then a plan with it may cut elsewhere (a plan
#: with the fixed cost off by less costs little more than the best one).
_REPLAN = 1.5
_REFERENCE = 64


def _sse(
    shapes: list[Shape], history: Collection[tuple[list[int], float]], cost: PassCost
) -> float:
    """Squared error of ``cost`` predicting each pass of ``history`` by its shape."""
    total = 0.0
    for planned, (_, seconds) in zip(shapes, history, strict=True):
        err = seconds - predict_s(planned, cost)
        total += err * err
    return total


def _moved(before: PassCost, after: PassCost) -> bool:
    """Whether a plan with ``after`` may cut elsewhere than one with ``before``.

    A plan depends on the cost's shape only (scaling all three terms cuts at the same
    places): the fixed cost in tokens, ``fixed / c`` (``c``: a token's cost at
    ``_REFERENCE`` tokens of length, attention included), and attention's share of ``c``.
    """
    shapes = []
    for cost in (before, after):
        c = cost.per_token_s + cost.attention_s * _REFERENCE
        if c <= 0:
            shapes.append((math.inf if cost.fixed_s > 0 else 0.0, 0.0))
        else:
            shapes.append((cost.fixed_s / c, cost.attention_s * _REFERENCE / c))
    (la, sa), (lb, sb) = shapes
    if math.isinf(la) or math.isinf(lb):
        return la != lb
    return abs(la - lb) > (_REPLAN - 1) * max(la, lb) + 0.5 or abs(sa - sb) > 0.1


class _Group:
    """A pass being formed by tokens: which items join it (see ``ByTokens.group``)."""

    __slots__ = ("est", "k", "limit", "longest")

    def __init__(self, est: PassCost | None, limit: float) -> None:
        self.est = est
        self.limit = limit
        self.longest = 0
        self.k = 0

    def force(self, size: int) -> None:
        """An item joins whatever it costs (a pass's first: the oldest always goes)."""
        if size > self.longest:
            self.longest = size
        self.k += 1

    def joins(self, size: int) -> bool:
        """Whether an item of ``size`` tokens joins (if so, it has joined).

        It joins within ``max_batch_tokens`` if one sub-pass of them all costs no more than
        the pass plus a sub-pass of its own (see the module docstring); unknown cost: it
        joins.
        """
        est = self.est
        k = self.k
        longest = self.longest
        if size > longest:
            if size * (k + 1) > self.limit or (
                est is not None
                and est.seconds(k + 1, size) > est.seconds(k, longest) + est.seconds(1, size)
            ):
                return False
            self.longest = size
        elif longest * (k + 1) > self.limit or (
            est is not None
            and est.seconds(k + 1, longest) > est.seconds(k, longest) + est.seconds(1, size)
        ):
            return False
        self.k = k + 1
        return True


class ByTokens(Generic[PayloadT]):
    """The pricing of passes by tokens, as length-sorted sub-passes (see the module docstring).

    Args:
        config: the batcher's settings.
        cost_model: the policy's item model, answered until the token model fits.
        token_prior: the sub-pass cost the token model starts from (it answers it until it
            has fitted ``_MIN_PASSES`` passes: the plan at dispatch uses it); by default
            zero, which plans every distinct length as its own sub-pass.

    Attributes:
        token_cost: the cost of a sub-pass, learned from every pass's planned shape.
        settled_depth: ``length_window * max_batch_size``: a pass is chosen among the
            oldest that many items, so only then can no later arrival change it.
        passes_s: each dispatched pass's predicted seconds, once the token model fits.
        fills: whether ``max_batch_tokens`` is set (a queue can then be full by tokens).
    """

    def __init__(
        self,
        config: BatchConfig,
        cost_model: CostModel,
        token_prior: PassCost | None = None,
    ) -> None:
        self._config = config
        self._cost_model = cost_model
        self.settled_depth = config.length_window * config.max_batch_size
        prior = token_prior if token_prior is not None else PassCost(fixed_s=0.0, per_token_s=0.0)
        self._prior = prior
        self._limit = config.max_batch_tokens if config.max_batch_tokens is not None else math.inf
        self.fills = config.max_batch_tokens is not None
        self.token_cost = PassCostModel(prior, min_samples=_MIN_PASSES)
        # The recent passes' sizes and seconds, to re-plan them when the estimate moves,
        # and the estimate the token model's shapes were planned with.
        self._history: deque[tuple[list[int], float]] = deque(maxlen=_REFIT_PASSES)
        self._planned_with = prior
        self._passes = 0
        self._queued_tokens = 0
        self._padded = 0
        self._real = 0
        # Each dispatched pass's planned shape, by batch id, until it finishes (its
        # predicted seconds are in ``passes_s``, read by admission).
        self._shapes: dict[int, Shape] = {}
        self.passes_s: dict[int, float] | None = {}
        self._recent: deque[int] = deque(maxlen=_WINDOW_PASSES * config.max_batch_size)
        self._square_error = 0.0
        self._error_weight = 0.0
        self._spread = 0.0
        self._derived = False
        self._fixed_s = self._extra_s = self._linear_s = self._square_s = 0.0
        self._per_item_s = 0.0
        # The cost a pass's items are grouped by (None: unknown, everything joins).
        self._group_by: PassCost | None = None
        # The typical full pass's planned shape, its real tokens and the estimate it was
        # planned with, and when (in passes); when the token model was last refitted.
        self._typical: tuple[Shape, int, PassCost] | None = None
        self._typical_at = 0
        self._refitted = -_REFIT_EVERY

    def tokens(self) -> TokenStats | None:
        """The tokens' figures: padded and real tokens run, queued tokens, the token model."""
        return TokenStats(
            padded=self._padded,
            real=self._real,
            queued=self._queued_tokens,
            cost=self.token_cost.estimate,
            cost_samples=self._passes,
        )

    # -- the queue's tokens ----------------------------------------------------------------

    def admit(self, size: int) -> int:
        """An item of ``size`` tokens is queued: the size its entry keeps.

        A size below 1 (an empty text) counts 1: every item takes a place in its pass.
        """
        if size < 1:
            size = 1
        self._queued_tokens += size
        return size

    def left(self, entry: Entry[PayloadT]) -> None:
        """A queued entry gives its tokens back."""
        self._queued_tokens -= entry.size

    def full(self) -> bool:
        """Whether the queued items hold ``max_batch_tokens`` tokens: a pass may go now."""
        return self._queued_tokens >= self._limit

    # -- forming a pass --------------------------------------------------------------------

    def group(self) -> _Group:
        """A pass about to be formed, grouped by the fitted cost and ``max_batch_tokens``."""
        return _Group(self._group_by, self._limit)

    def taken(self, entries: list[Entry[PayloadT]]) -> None:
        """A pass's entries left the queue: their tokens are counted as run."""
        real = 0
        recent = self._recent
        for e in entries:
            real += e.size
            recent.append(e.size)
        self._queued_tokens -= real
        self._real += real

    def dispatched(self, batch: Batch[PayloadT]) -> None:
        """A batch was dispatched: its plan, as the engine will run it."""
        # Plan the pass as the engine will, with the current estimate: its shape is learned
        # at ``finish``, its predicted seconds tell admission when its worker is free.
        sizes = [e.size for e in batch.entries]
        est = self.token_cost.estimate
        planned = shape(sizes, plan(sizes, est))
        self._padded += planned.tokens
        self._shapes[batch.id] = planned
        if self._derived:
            passes_s = self.passes_s
            assert passes_s is not None
            passes_s[batch.id] = predict_s(planned, est)

    # -- learning the cost -----------------------------------------------------------------

    def finished(
        self,
        now: float,
        batch: Batch[PayloadT],
        failed: Collection[Entry[PayloadT]],
        skipped: Collection[Entry[PayloadT]],
    ) -> None:
        """A pass ended: the token model learns its planned shape."""
        planned = self._shapes.pop(batch.id, None)
        passes_s = self.passes_s
        assert passes_s is not None
        passes_s.pop(batch.id, None)
        if failed or planned is None:
            return
        est = self.token_cost.estimate
        if skipped:
            skipped_ids = {e.id for e in skipped}
            sizes = [e.size for e in batch.entries if e.id not in skipped_ids]
            if not sizes:
                return
            planned = shape(sizes, plan(sizes, est))
        else:
            sizes = [e.size for e in batch.entries]
        seconds = now - batch.start
        if self._derived:
            # The error of the prediction before the model learns from it: admission's margin.
            err = seconds - predict_s(planned, est)
            d = _SPREAD_DECAY
            self._square_error = d * self._square_error + err * err
            self._error_weight = d * self._error_weight + 1.0
            self._spread = math.sqrt(self._square_error / self._error_weight)
        self._history.append((sizes, seconds))
        self.token_cost.observe(planned, seconds)
        self._passes += 1
        if self._passes - self._refitted >= _REFIT_EVERY and _moved(
            self._planned_with, self.token_cost.estimate
        ):
            self._refitted = self._passes
            self._refit()
        self._derive()

    def _refit(self) -> None:
        # The shapes learned so far were planned with an estimate the fit has since left:
        # re-plan the recent passes and fit again, until the estimate stays (a few rounds
        # at most). Without it the fit drifts to the truth only as fast as its decay
        # forgets the old plans (about 800 passes on a GPU-shaped cost from the zero prior,
        # measured; 5 with it). The policy's plan is its guess of the engine's, so more than
        # one estimate can reproduce itself (a fit that cuts where the engine does not,
        # and is fitted on those cuts): the rounds start twice, from the current estimate
        # and from passes run whole, and the fit that predicts the recent passes best is
        # kept. Rare once settled: the estimate then moves by less than ``_REPLAN``.
        history = self._history
        # The model as it is competes too, on the same passes planned with its estimate: a
        # refit on a short window of noisy passes must predict them better to replace it.
        current = self.token_cost
        kept = current.estimate
        first = [shape(sizes, plan(sizes, kept)) for sizes, _ in history]
        best: tuple[float, PassCostModel, PassCost] = (_sse(first, history, kept), current, kept)
        # Passes run whole need no plan: one sub-pass of every item, padded to the longest.
        whole = [
            Shape(1, len(sizes) * max(sizes), len(sizes) * max(sizes) ** 2) for sizes, _ in history
        ]
        for shapes, used in ((first, kept), (whole, _WHOLE)):
            for round_ in range(_REFIT_ROUNDS):
                if round_:
                    shapes = [shape(sizes, plan(sizes, used)) for sizes, _ in history]
                # Fitted once, at the last observation (not at each).
                model = PassCostModel(self._prior, min_samples=len(history))
                for planned, (_, seconds) in zip(shapes, history, strict=True):
                    model.observe(planned, seconds)
                est = model.estimate
                if not _moved(used, est):
                    break
                if round_ + 1 < _REFIT_ROUNDS:
                    used = est
            sse = _sse(shapes, history, model.estimate)
            if sse < best[0]:
                best = (sse, model, used)
        # Kept as it was, it is not re-planned again until it moves from where it is now.
        self.token_cost, self._planned_with = best[1], best[2]

    def costs(self, depth: int) -> tuple[float, float]:
        """``(fixed_s, per_item_s)`` for admission, at the queued items' mean tokens."""
        # One sub-pass, and per item the typical pass's extra sub-passes' share plus its
        # token parts at the queued items' mean tokens (see the module docstring). The item
        # model until the token model has fitted.
        if not self._derived:
            est = self._cost_model.estimate
            return est.fixed_s, est.per_item_s
        if not depth:
            return self._fixed_s, self._per_item_s
        mean = self._queued_tokens / depth
        return self._fixed_s, self._extra_s + mean * (self._linear_s + mean * self._square_s)

    def spread_s(self) -> float:
        """The token model's own prediction error (the item model's until it fits)."""
        if self._derived:
            return self._spread
        return self._cost_model.spread_s

    def _derive(self) -> None:
        # Admission's figures from the token model and the recent items' sizes, rebuilt when
        # either changes (a pass dispatched or finished), never per admission.
        tc = self.token_cost
        est = tc.estimate
        recent = self._recent
        self._derived = (
            tc.samples >= _MIN_PASSES
            and est.fixed_s + est.per_token_s + est.attention_s > 0
            and len(recent) > 0
        )
        # Grouping needs both a fixed and a token term: a fit that puts everything on one
        # (passes that do not vary tell them apart) says nothing about where to cut.
        self._group_by = (
            est if tc.samples >= _MIN_PASSES and est.fixed_s > 0 and est.per_token_s > 0 else None
        )
        if not self._derived:
            return
        b = self._config.max_batch_size
        typical = self._typical
        if (
            typical is None
            or self._passes - self._typical_at >= _TYPICAL_EVERY
            or _moved(typical[2], est)
        ):
            # Re-planned when the recent sizes may have drifted or the estimate moved: a
            # plan is the costly part (the figures below scale with the estimate).
            ordered = sorted(recent)
            k = len(ordered)
            sizes = [ordered[(2 * i + 1) * k // (2 * b)] for i in range(b)]
            typical = self._typical = (shape(sizes, plan(sizes, est)), sum(sizes), est)
            self._typical_at = self._passes
        planned, real = typical[0], typical[1]
        mean = real / b
        self._fixed_s = est.fixed_s
        self._extra_s = (planned.subpasses - 1) * est.fixed_s / b
        # Per item: linear in its tokens (``_linear_s`` a token), and attention's part,
        # quadratic (``_square_s`` a token squared), both at the typical pass's padding.
        self._linear_s = planned.tokens * est.per_token_s / real
        self._square_s = planned.tokens_sq * est.attention_s / (b * mean * mean)
        self._per_item_s = self._extra_s + mean * (self._linear_s + mean * self._square_s)
