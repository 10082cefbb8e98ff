"""Batches formed by tokens: a padded pass costs its longest item times its count.

Theory of operation
-------------------
:class:`TokenPolicy` is :class:`~batchserve.policy.core.Policy` for a model whose inputs are
padded to the longest of their pass (a transformer). Each entry carries its ``size`` in
tokens (``offer(now, payload, deadline, size)``), and a pass of ``n`` items whose longest
holds ``L`` tokens costs about ``fixed + per_token * n * L``: one 200-word passage in a pass
of short queries makes every query pay for 200 words. So the policy changes three things.

* **Which items go** (``_take``). The oldest queued item always goes, and when a pass goes is
  the plain policy's rule: when it is full or the oldest item has waited ``max_wait_s``. The
  rest of the pass is taken from the oldest ``length_window * max_batch_size`` queued items,
  oldest first, skipping any item that would break a bound (``max_batch_size`` items,
  ``max_batch_tokens`` padded tokens) or that would add more padded tokens to the pass than
  it would cost in a pass of its own: its own tokens plus the fixed cost of a pass
  expressed in tokens (``fixed / per_token``, from the token model). Everything joins until
  that is measured, and whenever the recent passes' padded sizes vary by less than 20% of
  their mean: then a fixed cost cannot be told from a per-token one (the fit's split is
  noise), and uniform texts need no grouping anyway. So texts of similar length travel
  together: on a CPU, where a pass's fixed cost is worth a few dozen tokens, a short query
  does not ride with a long passage; where it is worth thousands of tokens (a GPU, by the
  usual shape of its cost), nearly everything rides together, as by count.
  The oldest goes even if it alone is over ``max_batch_tokens``.

  No item is starved: every pass takes the oldest, so an item waits at most as many passes
  as there are items ahead of it, and in practice a few: the items ahead of it of other
  lengths go in passes of their own, in order of age. (Sorting the window by closeness in
  length instead was measured in the simulator: no more throughput, and items of an odd
  length waited longer.) Deadlines are kept by admission, below, and a pass bounded by
  ``max_batch_tokens`` keeps the wait behind one pass short.
* **When a pass is full.** Also when the queued items hold ``max_batch_tokens`` tokens.
* **The cost in tokens.** ``token_cost`` is a :class:`~batchserve.costmodel.CostModel` whose
  unit is a padded token, learned from every pass (``fixed + per_token * n * L``). Admission
  predicts with it: a pass costs the token model's fixed cost plus, per item, the queued
  items' mean tokens times the recent padding waste (never less than the padded tokens per
  item of recent passes), and its margin uses the token model's own prediction error. So a
  queue of long texts refuses sooner than a queue of short ones. Until the token model has
  measured a pass, the item model (the plain policy's) is used.

Counted for the statistics: the padded and the real tokens of every dispatched pass (their
ratio is the padding waste).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection
from dataclasses import replace
from typing import Generic

from batchserve.config import BatchConfig, CostEstimate
from batchserve.costmodel import CostModel
from batchserve.errors import ConfigError
from batchserve.policy.core import Policy
from batchserve.policy.entries import Batch, Entry, PayloadT
from batchserve.policy.outcomes import PolicyStats, TokenStats

__all__ = ["TokenPolicy", "make_policy"]

#: Weight kept by the recent padded tokens per item and the recent padding waste at each pass.
_TOKENS_DECAY = 0.9
#: Weight kept by the mean and mean square of the passes' padded tokens (the cost model's).
_SPREAD_DECAY = 0.97
#: The fixed and per-token costs are told apart only when the passes' padded tokens vary by
#: more than this squared coefficient of variation (a spread of 20% of the mean).
_MIN_VARIATION = 0.04


def make_policy(config: BatchConfig, *, sized: bool) -> Policy[PayloadT]:
    """The policy ``config`` asks for: by tokens or by count.

    Args:
        config: the batcher's settings (``batch_by``).
        sized: whether the driver knows each item's tokens (``auto`` then means tokens).

    Raises:
        ConfigError: ``batch_by`` is ``tokens`` (or ``max_batch_tokens`` is set) but the
            driver cannot size its items.
    """
    by = config.batch_by
    if by == "count" or (by == "auto" and not sized and config.max_batch_tokens is None):
        return Policy(config)
    if not sized:
        raise ConfigError(
            "batch_by tokens (or max_batch_tokens) needs a model that counts its inputs' "
            "tokens (a token_estimate method) or a sizer"
        )
    return TokenPolicy(config)


class TokenPolicy(Policy[PayloadT], Generic[PayloadT]):
    """The batching policy with passes formed by tokens (see the module docstring).

    Attributes:
        token_cost: the cost model in padded tokens, learned from every pass.
    """

    def __init__(self, config: BatchConfig, cost_model: CostModel | None = None) -> None:
        super().__init__(config, cost_model)
        # A pass is chosen among the oldest ``length_window * max_batch_size`` items: only
        # once that many wait can no later arrival change it, and may it be prefetched.
        self._settled_depth = config.length_window * config.max_batch_size
        self.token_cost = CostModel(CostEstimate(fixed_s=0.0, per_item_s=0.0))
        self._queued_tokens = 0
        self._padded = 0
        self._real = 0
        self._tokens_per_item = 0.0
        self._waste = 0.0
        self._derived = False
        self._fixed_s = self._per_token_s = self._per_item_s = 0.0
        self._slack = math.inf
        self._pad_mean = self._pad_square = 0.0

    def statistics(self) -> PolicyStats:
        """The plain policy's snapshot, with the tokens' figures."""
        return replace(
            super().statistics(),
            tokens=TokenStats(
                padded=self._padded,
                real=self._real,
                queued=self._queued_tokens,
                cost=self.token_cost.estimate,
                cost_samples=self.token_cost.samples,
            ),
        )

    # -- the queue's tokens ----------------------------------------------------------------

    def offer(
        self, now: float, payload: PayloadT, deadline: float | None = None, size: int = 1
    ) -> Entry[PayloadT]:
        """Admit an item of ``size`` tokens or refuse it at once (see ``Policy.offer``).

        A size below 1 (an empty text) counts 1: every item takes a place in its pass.
        """
        if size < 1:
            size = 1
        entry = super().offer(now, payload, deadline, size)
        self._queued_tokens += size
        return entry

    def cancel(self, now: float, entry: Entry[PayloadT]) -> bool:
        """The caller of ``entry`` left (see ``Policy.cancel``)."""
        left = super().cancel(now, entry)
        if left:
            self._queued_tokens -= entry.size
        return left

    def _expire(self, now: float) -> list[Entry[PayloadT]]:
        expired = super()._expire(now)
        for e in expired:
            self._queued_tokens -= e.size
        return expired

    def _due(self) -> float:
        limit = self.config.max_batch_tokens
        if limit is not None and self._queued_tokens >= limit:
            return -math.inf  # full by tokens: it may go now
        return super()._due()

    # -- forming a pass --------------------------------------------------------------------

    def _take(self, now: float, n: int) -> list[Entry[PayloadT]]:
        cfg = self.config
        queue = self._queue
        limit = cfg.max_batch_tokens if cfg.max_batch_tokens is not None else math.inf
        entries = iter(queue.values())
        head = next(entries)
        chosen = [head]
        longest = head.size
        if n > 1:
            # An item joins only if the pass grows by no more padded tokens than the item
            # would cost in a pass of its own: its own tokens plus the fixed cost of a pass,
            # in tokens. So a short text does not pay a long one's padding unless sharing the
            # fixed cost is worth more.
            slack = self._slack
            for e in itertools.islice(entries, cfg.length_window * cfg.max_batch_size - 1):
                size = e.size
                longer = size if size > longest else longest
                k = len(chosen)
                padded = longer * (k + 1)
                if padded > limit or padded - longest * k > size + slack:
                    continue
                chosen.append(e)
                longest = longer
                if k + 1 == n:
                    break
        real = 0
        for e in chosen:
            del queue[e.id]
            real += e.size
        self._tail_min = None  # the queue's batch boundaries moved
        self._queued_tokens -= real
        padded = longest * len(chosen)
        self._padded += padded
        self._real += real
        per_item = padded / len(chosen)
        if self._tokens_per_item:
            per_item = _TOKENS_DECAY * self._tokens_per_item + (1 - _TOKENS_DECAY) * per_item
        self._tokens_per_item = per_item
        waste = padded / real
        self._waste = (
            _TOKENS_DECAY * self._waste + (1 - _TOKENS_DECAY) * waste if self._waste else waste
        )
        self._derive()
        return chosen

    # -- learning the cost -----------------------------------------------------------------

    def finish(
        self,
        now: float,
        batch: Batch[PayloadT],
        *,
        failed: Collection[Entry[PayloadT]] = (),
        skipped: Collection[Entry[PayloadT]] = (),
        bisect_calls: int = 0,
    ) -> None:
        """End a pass (see ``Policy.finish``); the token model learns its padded tokens."""
        super().finish(now, batch, failed=failed, skipped=skipped, bisect_calls=bisect_calls)
        if failed:
            return
        skipped_ids = {e.id for e in skipped} if skipped else ()
        ran = [e.size for e in batch.entries if e.id not in skipped_ids]
        if ran:
            padded = max(ran) * len(ran)
            self.token_cost.observe(padded, now - batch.start)
            d = _SPREAD_DECAY if self._pad_mean else 0.0
            self._pad_mean = d * self._pad_mean + (1 - d) * padded
            self._pad_square = d * self._pad_square + (1 - d) * padded * padded
            self._derive()

    def _costs(self) -> tuple[float, float]:
        # The token model's fixed cost; per item, the queued items' mean tokens times the
        # recent padding waste (what they will cost once padded), never less than the
        # recent padded tokens per item. The item model until the token model has a pass.
        if not self._derived:
            est = self.cost_model.estimate
            return est.fixed_s, est.per_item_s
        fixed_s, per_token_s, per_item_s = self._fixed_s, self._per_token_s, self._per_item_s
        depth = len(self._queue)
        if depth:
            queued = per_token_s * self._waste * self._queued_tokens / depth
            if queued > per_item_s:
                per_item_s = queued
        return fixed_s, per_item_s

    def _spread_s(self) -> float:
        if self._derived:
            return self.token_cost.spread_s
        return self.cost_model.spread_s

    def _derive(self) -> None:
        # Admission's figures from the token model and the recent passes, rebuilt when either
        # changes (a pass dispatched or finished), never per admission.
        tc = self.token_cost
        self._derived = tc.samples > 0
        est = tc.estimate
        self._fixed_s = est.fixed_s
        self._per_token_s = est.per_item_s
        self._per_item_s = est.per_item_s * self._tokens_per_item
        # The fixed cost in tokens, which decides who joins a pass. Passes of nearly the same
        # padded size (uniform texts, full passes) cannot tell a fixed cost from a per-token
        # one: the split is noise there, and nothing needs grouping, so everything joins.
        mean = self._pad_mean
        varied = mean > 0 and self._pad_square - mean * mean > _MIN_VARIATION * mean * mean
        self._slack = est.fixed_s / est.per_item_s if varied and est.per_item_s > 0 else math.inf
