"""The quality gate of a reranker's or classifier's exported engine: what a user's ranking sees.

An exported engine (ONNX Runtime, OpenVINO, int8) computes a reranker's scores a little
differently from torch; what matters to a user is not the scores but what they decide. The
gate runs the candidate and the torch reference on the shipped quality set
(:mod:`batchserve.engines.quality_set`) and keeps the candidate only when:

* **a reranker**: for each of its queries, against all of its passages, the order of the
  passages is kept (Spearman's rank correlation, mean over the queries
  >= :data:`MIN_SPEARMAN`) and the top passage is the reference's for at least
  :data:`MIN_TOP_KEPT` of the queries; the scores' largest difference (after the sigmoid)
  is reported beside, within :data:`SCORE_TOLERANCE`;
* **a classifier**: the label (the largest logit) is the reference's for at least
  :data:`MIN_LABEL_KEPT` of the texts.

A pure function of the two engines' answers (:func:`gate_sequence`), so the thresholds are
tested with plain numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "MIN_LABEL_KEPT",
    "MIN_SPEARMAN",
    "MIN_TOP_KEPT",
    "SCORE_TOLERANCE",
    "SequenceVerdict",
    "gate_sequence",
    "spearman",
]

MIN_SPEARMAN = 0.99
MIN_TOP_KEPT = 0.95
MIN_LABEL_KEPT = 0.99
#: The largest difference of a reranker's sigmoid score to the reference's that passes.
SCORE_TOLERANCE = 0.05

Scorer = Callable[[Sequence[Any]], npt.NDArray[np.float32]]


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceVerdict:
    """The gate's figures for one engine against the torch reference.

    Attributes:
        kind: ``reranker`` or ``classifier``.
        passed: whether every threshold holds.
        spearman_mean, spearman_min: rank correlation of each query's passages (reranker).
        top_kept: share of queries whose top passage is kept (reranker).
        max_score_diff: the largest sigmoid score difference (reranker).
        label_kept: share of texts whose label is kept (classifier).
        items: pairs or texts compared.
    """

    kind: str
    passed: bool
    spearman_mean: float | None = None
    spearman_min: float | None = None
    top_kept: float | None = None
    max_score_diff: float | None = None
    label_kept: float | None = None
    items: int = 0

    def summary(self) -> str:
        """One line: the figures and the verdict."""
        if self.kind == "reranker":
            figures = (
                f"Spearman mean {self.spearman_mean:.4f} (>= {MIN_SPEARMAN}), min "
                f"{self.spearman_min:.4f}, top kept {self.top_kept:.1%} (>= {MIN_TOP_KEPT:.0%}), "
                f"max score diff {self.max_score_diff:.4f} (<= {SCORE_TOLERANCE})"
            )
        else:
            figures = f"label kept {self.label_kept:.1%} (>= {MIN_LABEL_KEPT:.0%})"
        return f"{figures} over {self.items} items: {'pass' if self.passed else 'FAIL'}"


def spearman(a: Sequence[float] | npt.NDArray[Any], b: Sequence[float] | npt.NDArray[Any]) -> float:
    """Spearman's rank correlation of two score lists (ties ranked by position)."""
    x = np.argsort(np.argsort(np.asarray(a, dtype=np.float64), kind="stable"), kind="stable")
    y = np.argsort(np.argsort(np.asarray(b, dtype=np.float64), kind="stable"), kind="stable")
    n = len(x)
    if n < 2:
        return 1.0
    d = (x - y).astype(np.float64)
    return float(1.0 - 6.0 * float(d @ d) / (n * (n * n - 1)))


def gate_sequence(
    reference: Scorer,
    candidate: Scorer,
    kind: str,
    *,
    queries: Sequence[str],
    passages: Sequence[str],
    texts: Sequence[str],
) -> SequenceVerdict:
    """Compare ``candidate`` with ``reference`` as a user's ranking or labels would.

    Args:
        reference: the torch engine (items to logit rows).
        candidate: the engine to gate.
        kind: ``reranker`` (each query against every passage) or ``classifier`` (texts).
        queries: a reranker's queries.
        passages: the passages ranked for each query.
        texts: a classifier's texts.
    """
    if kind == "reranker":
        pairs = [(q, p) for q in queries for p in passages]
        ref = np.asarray(reference(pairs), dtype=np.float64)[:, 0].reshape(len(queries), -1)
        got = np.asarray(candidate(pairs), dtype=np.float64)[:, 0].reshape(len(queries), -1)
        rhos = [spearman(r, g) for r, g in zip(ref, got, strict=True)]
        top = float(np.mean(np.argmax(ref, axis=1) == np.argmax(got, axis=1)))
        diff = float(np.max(np.abs(1 / (1 + np.exp(-ref)) - 1 / (1 + np.exp(-got)))))
        mean = float(np.mean(rhos))
        return SequenceVerdict(
            kind=kind,
            passed=mean >= MIN_SPEARMAN and top >= MIN_TOP_KEPT and diff <= SCORE_TOLERANCE,
            spearman_mean=mean,
            spearman_min=float(np.min(rhos)),
            top_kept=top,
            max_score_diff=diff,
            items=len(pairs),
        )
    ref_labels = np.argmax(np.asarray(reference(list(texts))), axis=1)
    got_labels = np.argmax(np.asarray(candidate(list(texts))), axis=1)
    kept = float(np.mean(ref_labels == got_labels))
    return SequenceVerdict(
        kind=kind, passed=kept >= MIN_LABEL_KEPT, label_kept=kept, items=len(texts)
    )
