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

Beside these rates, a per-item floor that depends on the engine's precision
(:func:`score_floor`): at float32 every score (a reranker's sigmoid, a classifier's softmax)
within 1e-4 of the reference's, every query's order kept and every label kept (but between
items whose reference scores lie within the floor of each other, a tie); at half precision
the same within 1e-2; int8 is judged by the rates alone (its scores within
:data:`SCORE_TOLERANCE`). One item far off is not hidden by a rate.

A pure function of the two engines' answers (:func:`gate_sequence`), so the thresholds are
tested with plain numbers.

**Batch invariance** holds a reranker to what it holds an embedder to: a pair scored alone
and the same pair scored among random batch-mates must get the same score.
:func:`score_similarity` is the figure :func:`batchserve.engines.quality.invariance`
measures for these kinds: one minus the largest change of an item's score (its kind's
activation, :meth:`Kind.activate <batchserve.models.kinds.Kind.activate>`: the sigmoid of
a reranker's logit, a classifier's softmax probabilities), so that the embedder's bound
(:data:`~batchserve.engines.quality.MIN_INVARIANCE`, 0.9999) reads the same for every kind:
a score may move by at most 1e-4 with its batch-mates. ``--backend auto`` screens it before
the gate (:class:`SequenceJudge`), as it does for an embedder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.models.kinds import GateName, Kind, kind_named

__all__ = [
    "FLOAT32_SCORE",
    "GATES",
    "GATE_QUERIES",
    "HALF_SCORE",
    "GATE_TEXTS",
    "MIN_LABEL_KEPT",
    "MIN_SPEARMAN",
    "MIN_TOP_KEPT",
    "SCORE_TOLERANCE",
    "SequenceJudge",
    "SequenceVerdict",
    "gate_sequence",
    "score_floor",
    "score_similarity",
    "spearman",
]

MIN_SPEARMAN = 0.99
MIN_TOP_KEPT = 0.95
MIN_LABEL_KEPT = 0.99
#: The largest difference of a reranker's sigmoid score to the reference's that passes int8.
SCORE_TOLERANCE = 0.05
#: ... at float32, where the order and every label must be kept too.
FLOAT32_SCORE = 1e-4
#: ... at half precision.
HALF_SCORE = 1e-2
#: The gate's slice of the quality set for a reranker: these many queries, each against
#: every passage (a MiniLM-L6 reranker scores them twice in about a minute on one core),
#: and a classifier's texts.
GATE_QUERIES = 16
GATE_TEXTS = 256

#: The gates this module judges (:attr:`Kind.gate <batchserve.models.kinds.Kind.gate>`):
#: each query's ranking of its passages, and each text's top label.
GATES: tuple[GateName, ...] = ("order", "label")

Scorer = Callable[[Sequence[Any]], npt.NDArray[np.float32]]


def score_floor(dtype: str) -> float | None:
    """How far an engine in ``dtype`` may move any item's score, its order and label kept.

    None (int8): only the rates and :data:`SCORE_TOLERANCE` bound it.
    """
    if dtype == "float32":
        return FLOAT32_SCORE
    if dtype.removesuffix("-mixed") in ("float16", "bfloat16"):
        return HALF_SCORE
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceVerdict:
    """The gate's figures for one engine against the torch reference.

    Attributes:
        kind: the model's kind: a reranker or a classifier (its :attr:`~Kind.gate`, ``order``
            or ``label``, says which figures it has).
        passed: whether every threshold holds.
        spearman_mean, spearman_min: rank correlation of each query's passages (reranker).
        top_kept: share of queries whose top passage is kept (reranker).
        max_score_diff: the largest sigmoid score difference (reranker).
        label_kept: share of texts whose label is kept (classifier).
        items: pairs or texts compared.
        floor: the per-item floor of the engine's precision (:func:`score_floor`; None:
            int8, bound by the rates alone).
        order_kept: share of queries whose order is kept, ties within the floor aside
            (reranker), or of texts whose label is (classifier); None without a floor.
    """

    kind: Kind
    passed: bool
    spearman_mean: float | None = None
    spearman_min: float | None = None
    top_kept: float | None = None
    max_score_diff: float | None = None
    label_kept: float | None = None
    items: int = 0
    floor: float | None = None
    order_kept: float | None = None

    @property
    def passes(self) -> bool:
        """Whether every threshold holds (read as an embedder's ``Quality.passes`` is)."""
        return self.passed

    def failed_bounds(self) -> list[str]:
        """The short names of the thresholds missed (``Spearman``, ``top``, ``score``...)."""
        names = []
        if self.spearman_mean is not None and self.spearman_mean < MIN_SPEARMAN:
            names.append("Spearman")
        if self.top_kept is not None and self.top_kept < MIN_TOP_KEPT:
            names.append("top")
        bound = SCORE_TOLERANCE if self.floor is None else self.floor
        if self.max_score_diff is not None and self.max_score_diff > bound:
            names.append("score")
        if self.label_kept is not None and self.label_kept < MIN_LABEL_KEPT:
            names.append("label")
        if self.order_kept is not None and self.order_kept < 1.0:
            names.append("order")
        return names

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values (``kind``, its name, tells them from an embedder's)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["kind"] = self.kind.name
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SequenceVerdict:
        """Read back what :meth:`to_dict` wrote."""
        names = {f.name for f in dataclasses.fields(cls)} - {"kind"}
        kept = {k: v for k, v in data.items() if k in names}
        return cls(kind=kind_named(str(data["kind"])), **kept)

    def summary(self) -> str:
        """One line: the figures and the verdict."""
        bound = SCORE_TOLERANCE if self.floor is None else self.floor
        if self.kind.gate == "order":
            figures = (
                f"Spearman mean {self.spearman_mean:.4f} (>= {MIN_SPEARMAN}), min "
                f"{self.spearman_min:.4f}, top kept {self.top_kept:.1%} (>= {MIN_TOP_KEPT:.0%}), "
                f"max score diff {self.max_score_diff:.2e} (<= {bound})"
            )
        else:
            figures = f"label kept {self.label_kept:.1%} (>= {MIN_LABEL_KEPT:.0%})"
            if self.max_score_diff is not None:
                figures += f", max score diff {self.max_score_diff:.2e} (<= {bound})"
        if self.order_kept is not None:
            figures += f", every {self.kind.gate} kept: {self.order_kept:.1%}"
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
    kind: Kind,
    *,
    queries: Sequence[str],
    passages: Sequence[str],
    texts: Sequence[str],
    dtype: str = "int8",
) -> SequenceVerdict:
    """Compare ``candidate`` with ``reference`` as a user's ranking or labels would.

    Args:
        reference: the torch engine (items to logit rows).
        candidate: the engine to gate.
        kind: the model's kind: its gate is ``order`` (a reranker: each query against every
            passage) or ``label`` (a classifier: texts).
        queries: a reranker's queries.
        passages: the passages ranked for each query.
        texts: a classifier's texts.
        dtype: the candidate's precision: it sets the per-item floor (:func:`score_floor`).
    """
    floor = score_floor(dtype)
    if kind.gate == "order":
        pairs = [(q, p) for q in queries for p in passages]
        ref = np.asarray(reference(pairs), dtype=np.float64)[:, 0].reshape(len(queries), -1)
        got = np.asarray(candidate(pairs), dtype=np.float64)[:, 0].reshape(len(queries), -1)
        rhos = [spearman(r, g) for r, g in zip(ref, got, strict=True)]
        top = float(np.mean(np.argmax(ref, axis=1) == np.argmax(got, axis=1)))
        p_ref, p_got = kind.activate(ref), kind.activate(got)
        diff = float(np.max(np.abs(p_ref - p_got)))
        mean = float(np.mean(rhos))
        order = None if floor is None else _order_kept(p_ref, p_got, floor)
        verdict = SequenceVerdict(
            kind=kind,
            passed=False,
            spearman_mean=mean,
            spearman_min=float(np.min(rhos)),
            top_kept=top,
            max_score_diff=diff,
            items=len(pairs),
            floor=floor,
            order_kept=order,
        )
        return dataclasses.replace(verdict, passed=not verdict.failed_bounds())
    ref_p = kind.activate(np.asarray(reference(list(texts))))
    got_p = kind.activate(np.asarray(candidate(list(texts))))
    kept = float(np.mean(np.argmax(ref_p, axis=1) == np.argmax(got_p, axis=1)))
    verdict = SequenceVerdict(
        kind=kind,
        passed=False,
        label_kept=kept,
        items=len(texts),
        max_score_diff=None if floor is None else float(np.max(np.abs(ref_p - got_p))),
        floor=floor,
        order_kept=None if floor is None else _labels_kept(ref_p, got_p, floor),
    )
    return dataclasses.replace(verdict, passed=not verdict.failed_bounds())


def _order_kept(ref: npt.NDArray[Any], got: npt.NDArray[Any], floor: float) -> float:
    # The share of queries (rows) whose passages keep their order, but for pairs whose
    # reference scores lie within the floor of each other (a tie the floor allows to flip).
    kept = 0
    for r, g in zip(ref, got, strict=True):
        apart = (r[:, None] - r[None, :]) > floor
        flipped = apart & (g[:, None] <= g[None, :])
        kept += not bool(flipped.any())
    return kept / len(ref) if len(ref) else 1.0


def _labels_kept(ref: npt.NDArray[Any], got: npt.NDArray[Any], floor: float) -> float:
    # The share of texts whose label is kept, but for those whose two best reference
    # probabilities lie within the floor of each other (a tie).
    top2 = np.sort(ref, axis=1)[:, -2:] if ref.shape[1] > 1 else np.zeros((len(ref), 2))
    tie = (top2[:, 1] - top2[:, 0]) <= floor
    same = np.argmax(ref, axis=1) == np.argmax(got, axis=1)
    return float(np.mean(same | tie)) if len(ref) else 1.0


def score_similarity(
    kind: Kind,
) -> Callable[[npt.NDArray[Any], npt.NDArray[Any]], npt.NDArray[Any]]:
    """The invariance figure of a ``kind``: one minus each row's largest score change."""

    def similarity(alone: npt.NDArray[Any], together: npt.NDArray[Any]) -> npt.NDArray[Any]:
        change = np.abs(kind.activate(alone) - kind.activate(together))
        out: npt.NDArray[Any] = 1.0 - change.max(axis=1)
        return out

    return similarity


def _item_size(item: str | tuple[str, str]) -> int:
    return len(item) if isinstance(item, str) else len(item[0]) + len(item[1])


class SequenceJudge:
    """How ``--backend auto`` times and gates a reranker's or classifier's engines.

    The counterpart of the embedder's judge in :mod:`batchserve.engines.choice`: the engines
    are timed on what the kind serves (a reranker: one short query against the reference
    manual's paragraphs, as a search ranks its candidates; a classifier: the paragraphs),
    screened for batch invariance (:func:`score_similarity`) and gated by
    :func:`gate_sequence` against the torch float32 reference on the shipped set.

    Args:
        kind: the model's kind: a reranker (gated on ``order``) or a classifier (``label``).
        quality_set: the gate's queries, passages and texts.
    """

    def __init__(self, kind: Kind, quality_set: Any) -> None:
        self.kind = kind
        self._qs = quality_set
        queries = list(quality_set.queries[:GATE_QUERIES])
        passages = list(quality_set.passages)
        self._probe_items: list[Any] = (
            [(queries[i % len(queries)], p) for i, p in enumerate(passages)]
            if kind.gate == "order"
            else list(quality_set.texts[:GATE_TEXTS])
        )

    def key(self) -> dict[str, Any]:
        """What the verdict depends on besides the engines and the machine."""
        import hashlib
        import json

        from batchserve.engines.corpus import digest as corpus_digest

        qs = self._qs
        blob = json.dumps([qs.queries[:GATE_QUERIES], qs.passages, qs.texts[:GATE_TEXTS]])
        return {
            "kind": self.kind.name,
            "set": hashlib.sha256(blob.encode()).hexdigest()[:16],
            "speed_texts": corpus_digest(),
        }

    def batches(self, batch_size: int, workers: int) -> list[list[Any]]:
        """The requests the engines are timed on (see the class docstring)."""
        from batchserve.engines.corpus import speed_texts

        texts = speed_texts(batch_size, workers)
        if self.kind.gate != "order":
            return [list(b) for b in texts]
        queries = self._qs.queries
        return [[(queries[i % len(queries)], t) for t in b] for i, b in enumerate(texts)]

    def unavailable(self, engine: Any) -> str | None:
        """OpenVINO's int8 is not offered: its calibration embeds texts."""
        if engine.backend == "openvino-int8":
            return f"not offered for a {self.kind.name} (its int8 calibration embeds texts)"
        return None

    def screen(self, fn: Scorer, batch_size: int) -> float:
        """The batch invariance of ``fn`` (1 - the largest score change; seconds)."""
        from batchserve.engines.quality import invariance

        worst, _ = invariance(
            fn,
            self._probe_items,
            batch_size=batch_size,
            similarity=score_similarity(self.kind),
            size=_item_size,
        )
        return worst

    def reference(self, fn: Scorer, batch_size: int) -> tuple[None, float]:
        """The reference's own figures: no gate (it is the reference), its invariance."""
        return None, self.screen(fn, batch_size)

    def gate(self, engine: Any, fn: Scorer, reference: Scorer) -> SequenceVerdict:
        """``fn``'s ranking or labels against the reference's (a minute or so on a CPU)."""
        qs = self._qs
        return gate_sequence(
            reference,
            fn,
            self.kind,
            queries=qs.queries[:GATE_QUERIES],
            passages=qs.passages,
            texts=qs.texts[:GATE_TEXTS],
            dtype=engine.dtype,
        )
