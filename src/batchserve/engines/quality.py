"""The quality gate: how close an engine's embeddings stay to the fp32 reference.

Theory of operation: a reduced-precision engine (int8, bfloat16) or another runtime is only
chosen if its embeddings keep their meaning *and* behave as an index needs them to.
:func:`against` embeds the gate's texts (:class:`~QualitySet`) with the candidate, in
batches, compares them with the reference's (torch float32) embeddings of the same texts,
and measures:

* **cosine**: of each text's two embeddings (the set's texts and its neighbour paragraphs):
  their mean and minimum, the minimum held to a per-text floor that depends on the
  engine's precision (:func:`~batchserve.engines.edges.cosine_floor`: 0.9999 at float32,
  0.999 at half precision; int8 has none), so that one text far off is not hidden by the
  mean;
* **the edges**: every engine, the reference too, against ``SentenceTransformer.encode``
  itself on the texts at the model's edges (past its window, past 512 tokens, spaces
  around, the empty string, many scripts, each prompt; :mod:`batchserve.engines.edges`),
  text by text, to the same floor;
* **retrieval agreement** (QA kept): each query of the retrieval set is ranked against all
  passages by cosine; the fraction of queries whose nearest passage is the same under both;
* **nearest kept** and **top-10 overlap** on the *neighbours*: many paragraphs on the same
  topics (Python's reference manual, :func:`~reference_paragraphs`), each ranked
  against all the others, as an index ranks a document against its corpus. The fraction of
  paragraphs whose nearest other paragraph is the same under both, and the mean overlap of
  their ten nearest (:func:`neighbour_agreement`). Close neighbours are where a small error
  reorders a ranking: the shipped retrieval set, with five passages per topic, hardly shows it;
* **batch invariance**: the smallest cosine between a text embedded alone and the same text
  embedded among random batch-mates (:func:`invariance`). A user who embeds a document in a
  batch at indexing time and alone at query time must get the same vector; an engine whose
  arithmetic depends on the batch (dynamic int8 takes its activation scales per pass)
  breaks that, whatever its cosine to fp32.

Two verdicts come out of the figures (:class:`Quality`):

* :attr:`Quality.servable`: the meaning is kept (mean cosine >= :data:`MIN_MEAN_COSINE`,
  QA kept >= :data:`MIN_RANKING_AGREEMENT`), and, at float32, every text is within the
  floor (a float32 vector is never served wrong): the floor for serving an engine asked
  for by name;
* :attr:`Quality.passes`: every bound, the index-shaped ones too (nearest kept >=
  :data:`MIN_NEAREST_KEPT`, top-10 overlap >= :data:`MIN_TOP10_OVERLAP`, invariance >=
  :data:`MIN_INVARIANCE`) and every text within the floor: what ``--backend auto``
  requires of an engine before serving it.

The figures are what ``batchserve profile`` prints beside each engine's cost curve, what
the ``auto`` verdict's table shows, and what the gate caches so it runs once per model and
engine, not at every start.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.edges import Edges, cosine_floor
from batchserve.engines.quality_set import QualitySet

__all__ = [
    "INVARIANCE_PROBES",
    "MIN_INVARIANCE",
    "MIN_MEAN_COSINE",
    "MIN_NEAREST_KEPT",
    "MIN_RANKING_AGREEMENT",
    "MIN_TOP10_OVERLAP",
    "TOP_K",
    "Quality",
    "against",
    "all_texts",
    "compare",
    "cosine_rows",
    "embed_all",
    "invariance",
    "itself",
    "nearest",
    "neighbour_agreement",
]

#: The gate's bound on the mean cosine to the fp32 embeddings.
MIN_MEAN_COSINE = 0.99
#: The gate's bound on the fraction of queries whose nearest passage is unchanged.
MIN_RANKING_AGREEMENT = 0.95
#: The bound on the fraction of neighbour paragraphs whose nearest other one is unchanged.
MIN_NEAREST_KEPT = 0.95
#: The bound on the mean overlap of each neighbour paragraph's ten nearest.
MIN_TOP10_OVERLAP = 0.9
#: The bound on the smallest cosine between a text alone and the same text in a batch.
MIN_INVARIANCE = 0.9999
#: How many nearest neighbours the overlap compares.
TOP_K = 10
#: Texts embedded alone and in random batches for the invariance figure.
INVARIANCE_PROBES = 64
#: Shuffles of the probes into batches (each probe meets other batch-mates in each).
INVARIANCE_ROUNDS = 2
_SEED = 20261202

Embed = Callable[[Sequence[str]], npt.NDArray[np.float32]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Quality:
    """A candidate's embeddings against the reference's.

    Attributes:
        texts: how many texts were compared (the set's texts and its neighbours).
        mean_cosine: mean over the texts of the cosine between the two embeddings.
        min_cosine: the smallest such cosine.
        queries: how many retrieval queries were ranked.
        ranking_agreement: the fraction of queries whose nearest passage is the same.
        neighbours: how many neighbour paragraphs were ranked among themselves (0: the set
            has none, and the two figures below are None).
        nearest_kept: the fraction of neighbours whose nearest other one is the same.
        top10_overlap: the mean fraction of each neighbour's ten nearest kept.
        invariance: the smallest cosine between a text embedded alone and in a batch.
        probes: how many texts the invariance was measured on.
        seconds: what measuring took (the candidate's passes; the reference's excluded).
        precision: the engine's precision (it sets the per-text floor).
        worst_text: the start of the text of the smallest cosine.
        edges: the figures on the model's edge texts against the library (None: not
            measured).
    """

    texts: int
    mean_cosine: float
    min_cosine: float
    queries: int
    ranking_agreement: float
    neighbours: int = 0
    nearest_kept: float | None = None
    top10_overlap: float | None = None
    invariance: float = 1.0
    probes: int = 0
    seconds: float = 0.0
    precision: str = "float32"
    worst_text: str = ""
    edges: Edges | None = None

    @property
    def floor(self) -> float | None:
        """The cosine every text must reach at this precision (None: not bounded)."""
        return cosine_floor(self.precision)

    @property
    def servable(self) -> bool:
        """Whether the meaning is kept: the floor for an engine asked for by name."""
        return not self.failures(index=False)

    @property
    def passes(self) -> bool:
        """Whether every bound is met, the index-shaped ones too (what ``auto`` requires)."""
        return not self.failures()

    def failures(self, *, index: bool = True) -> list[str]:
        """One phrase per bound missed, naming the figure, the rule and the value.

        Args:
            index: include the index-shaped bounds (nearest kept, top-10 overlap,
                invariance); False gives only the meaning's (mean cosine, QA kept, and at
                float32 the per-text floor: a float32 engine is never served wrong).
        """
        out = []
        if self.precision == "float32" or index:
            out += self._floor_failures()
        if self.mean_cosine < MIN_MEAN_COSINE:
            out.append(
                f"mean cosine to fp32 must be >= {MIN_MEAN_COSINE}, got {self.mean_cosine:.4f}"
            )
        if self.ranking_agreement < MIN_RANKING_AGREEMENT:
            out.append(
                f"nearest-passage agreement must be >= {MIN_RANKING_AGREEMENT}, "
                f"got {self.ranking_agreement:.3f}"
            )
        if not index:
            return out
        if self.nearest_kept is not None and self.nearest_kept < MIN_NEAREST_KEPT:
            out.append(
                f"nearest neighbour kept must be >= {MIN_NEAREST_KEPT:.0%}, "
                f"got {self.nearest_kept:.1%}"
            )
        if self.top10_overlap is not None and self.top10_overlap < MIN_TOP10_OVERLAP:
            out.append(
                f"top-{TOP_K} overlap must be >= {MIN_TOP10_OVERLAP}, got {self.top10_overlap:.3f}"
            )
        if self.invariance < MIN_INVARIANCE:
            out.append(
                f"batch invariance (cosine of a text alone to it in a batch) must be "
                f">= {MIN_INVARIANCE}, got {self.invariance:.6f}"
            )
        return out

    def _floor_failures(self) -> list[str]:
        out = []
        floor = self.floor
        if floor is not None and self.texts and not self.min_cosine >= floor:
            out.append(
                f"cosine to torch float32 on every text must be >= {floor}, got "
                f"{self.min_cosine:.4f} on {self.worst_text!r}"
            )
        if self.edges is not None:
            out += self.edges.failures()
        return out

    def failed_bounds(self) -> list[str]:
        """The short names of the bounds missed (``mean cos``, ``QA``, ``NN``, ...)."""
        names = []
        floor = self.floor
        if floor is not None and self.texts and not self.min_cosine >= floor:
            names.append("min cos")
        if self.edges is not None and not self.edges.passes:
            names.append("edges")
        if self.mean_cosine < MIN_MEAN_COSINE:
            names.append("mean cos")
        if self.ranking_agreement < MIN_RANKING_AGREEMENT:
            names.append("QA")
        if self.nearest_kept is not None and self.nearest_kept < MIN_NEAREST_KEPT:
            names.append("NN")
        if self.top10_overlap is not None and self.top10_overlap < MIN_TOP10_OVERLAP:
            names.append("top-10")
        if self.invariance < MIN_INVARIANCE:
            names.append("invariance")
        return names

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values, with ``passes`` and ``servable``."""
        return {
            "texts": self.texts,
            "mean_cosine": self.mean_cosine,
            "min_cosine": self.min_cosine,
            "queries": self.queries,
            "ranking_agreement": self.ranking_agreement,
            "neighbours": self.neighbours,
            "nearest_kept": self.nearest_kept,
            "top10_overlap": self.top10_overlap,
            "invariance": self.invariance,
            "probes": self.probes,
            "seconds": self.seconds,
            "precision": self.precision,
            "floor": self.floor,
            "worst_text": self.worst_text,
            "edges": None if self.edges is None else self.edges.to_dict(),
            "servable": self.servable,
            "passes": self.passes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Quality:
        """Read back what :meth:`to_dict` wrote.

        Raises:
            KeyError: a field is missing (a file of an older gate, measured again).
        """
        kept, overlap = data["nearest_kept"], data["top10_overlap"]
        edges = data["edges"]
        return cls(
            texts=int(data["texts"]),
            mean_cosine=float(data["mean_cosine"]),
            min_cosine=float(data["min_cosine"]),
            queries=int(data["queries"]),
            ranking_agreement=float(data["ranking_agreement"]),
            neighbours=int(data["neighbours"]),
            nearest_kept=None if kept is None else float(kept),
            top10_overlap=None if overlap is None else float(overlap),
            invariance=float(data["invariance"]),
            probes=int(data["probes"]),
            seconds=float(data["seconds"]),
            precision=str(data["precision"]),
            worst_text=str(data["worst_text"]),
            edges=None if edges is None else Edges.from_dict(edges),
        )


def embed_all(
    embed: Embed, texts: Sequence[str], *, batch_size: int = 32, workers: int = 1
) -> npt.NDArray[np.float32]:
    """Embed ``texts`` in batches of ``batch_size``, in order; rows are unit length.

    Texts are sorted by length before batching (and put back in order after), so that
    padding costs little. ``workers`` batches run at once on as many threads (for a model
    that releases the GIL, as every engine here does).
    """
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    chunks = [
        [texts[i] for i in order[start : start + batch_size]]
        for start in range(0, len(order), batch_size)
    ]
    if not chunks:
        return np.zeros((0, 0), dtype=np.float32)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            rows = [np.asarray(r, dtype=np.float32) for r in pool.map(embed, chunks)]
    else:
        rows = [np.asarray(embed(chunk), dtype=np.float32) for chunk in chunks]
    sorted_out = np.concatenate(rows)
    out = np.empty_like(sorted_out)
    out[np.asarray(order)] = sorted_out
    return _unit(out)


def _unit(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit: npt.NDArray[np.float32] = (rows / np.maximum(norms, 1e-12)).astype(np.float32)
    return unit


def nearest(queries: npt.NDArray[np.float32], passages: npt.NDArray[np.float32]) -> list[int]:
    """For each (unit) query row, the index of the passage row of highest cosine."""
    return [int(i) for i in np.argmax(queries @ passages.T, axis=1)]


def _ranked(rows: npt.NDArray[np.float32], k: int, block: int) -> npt.NDArray[np.int64]:
    # Each row's k nearest other rows, nearest first (itself left out), a block at a time so
    # that a large set never holds its whole similarity matrix.
    n = rows.shape[0]
    out = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, block):
        sims = rows[start : start + block] @ rows.T
        sims[np.arange(sims.shape[0]), np.arange(start, start + sims.shape[0])] = -np.inf
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1, kind="stable")
        out[start : start + block] = np.take_along_axis(top, order, axis=1)
    return out


def neighbour_agreement(
    ref: npt.NDArray[np.float32],
    cand: npt.NDArray[np.float32],
    *,
    k: int = TOP_K,
    block: int = 512,
) -> tuple[float, float]:
    """How well ``cand``'s rows keep ``ref``'s neighbourhoods, each row ranked among the others.

    Args:
        ref: the reference's unit rows, one per text.
        cand: the candidate's unit rows for the same texts.
        k: how many nearest the overlap compares (fewer when the set is smaller).
        block: rows ranked at once (memory: ``block`` x rows floats).

    Returns:
        ``(nearest kept, top-k overlap)``: the fraction of rows whose nearest other row
        is the same under both, and the mean fraction of each row's ``k`` nearest that
        both share (order within them aside). ``(1.0, 1.0)`` for fewer than two rows.

    Raises:
        ValueError: the two have different shapes.
    """
    if ref.shape != cand.shape:
        raise ValueError(f"ref and cand must have one shape, got {ref.shape} and {cand.shape}")
    n = ref.shape[0]
    if n < 2:
        return 1.0, 1.0
    k = max(1, min(k, n - 1))
    top_ref, top_cand = _ranked(ref, k, block), _ranked(cand, k, block)
    kept = float(np.mean(top_ref[:, 0] == top_cand[:, 0]))
    shared = (top_ref[:, :, None] == top_cand[:, None, :]).any(axis=2).sum(axis=1)
    return kept, float(np.mean(shared) / k)


def cosine_rows(
    alone: npt.NDArray[np.float32], together: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Each row's cosine between its two answers (the embedder's invariance measure)."""
    out: npt.NDArray[np.float32] = np.sum(_unit(alone) * _unit(together), axis=1)
    return out


#: Compares rows answered alone with the same rows answered in a batch: one figure per row,
#: 1 when identical, lower the further apart.
Similarity = Callable[[npt.NDArray[np.float32], npt.NDArray[np.float32]], npt.NDArray[Any]]


def invariance(
    embed: Callable[[Sequence[Any]], Any],
    texts: Sequence[Any],
    *,
    probes: int = INVARIANCE_PROBES,
    batch_size: int = 32,
    rounds: int = INVARIANCE_ROUNDS,
    seed: int = _SEED,
    similarity: Similarity = cosine_rows,
    size: Callable[[Any], int] = len,
) -> tuple[float, int]:
    """The smallest similarity between an item answered alone and the same item in a batch.

    ``probes`` items spread over the length range of ``texts`` (every k-th by ``size``, so
    the longest and the shortest are among them) are each answered alone, then shuffled
    (seeded) into batches of ``batch_size`` and answered again, ``rounds`` times: each probe
    meets other batch-mates, padded to another length, in each round. For an embedder the
    figure is the cosine of the two vectors (``similarity``; a reranker's or classifier's
    is one minus its scores' largest change,
    :func:`batchserve.engines.ranking_gate.score_similarity`).
    An engine whose arithmetic does not depend on the batch scores 1 up to rounding (torch
    float32: 1 - 1e-7); dynamic int8 scores far lower, as its activation scales are taken
    per pass.

    Blocks for ``probes`` one-item passes and ``rounds * probes / batch_size`` batches.

    Returns:
        ``(the smallest similarity, how many probes)``; ``(1.0, 0)`` when ``texts`` is empty.
    """
    ordered = sorted(texts, key=size)
    count = min(probes, len(ordered))
    if count == 0:
        return 1.0, 0
    step = len(ordered) / count
    picked = [ordered[int(i * step)] for i in range(count)]
    if len(ordered) > count:
        picked[-1] = ordered[-1]
    alone = np.concatenate([np.asarray(embed([t]), dtype=np.float32) for t in picked])
    rng = random.Random(seed)
    worst = 1.0
    for _ in range(max(1, rounds)):
        index = list(range(count))
        rng.shuffle(index)
        for start in range(0, count, batch_size):
            chunk = index[start : start + batch_size]
            together = np.asarray(embed([picked[i] for i in chunk]), dtype=np.float32)
            worst = min(worst, float(np.min(similarity(alone[chunk], together))))
    return worst, count


def compare(
    reference: Embed,
    candidate: Embed,
    qs: QualitySet,
    *,
    batch_size: int = 32,
    precision: str = "float32",
) -> Quality:
    """Measure ``candidate`` against ``reference`` on ``qs`` (see the module docstring).

    Blocks while both embed every text (seconds to minutes on a CPU). ``precision`` is the
    candidate's (it sets the per-text floor).
    """
    ref = embed_all(reference, all_texts(qs), batch_size=batch_size)
    return against(ref, candidate, qs, batch_size=batch_size, precision=precision)


def itself(reference: Embed, qs: QualitySet, *, batch_size: int = 32) -> Quality:
    """The reference's figures against itself: 1 by definition, but for its invariance.

    Blocks for the invariance probes' passes only (:func:`invariance`).
    """
    start = time.perf_counter()
    worst, probes = invariance(reference, qs.texts, batch_size=batch_size)
    m = len(qs.neighbours)
    return Quality(
        texts=len(qs.texts) + m,
        mean_cosine=1.0,
        min_cosine=1.0,
        queries=len(qs.queries),
        ranking_agreement=1.0,
        neighbours=m,
        nearest_kept=1.0 if m else None,
        top10_overlap=1.0 if m else None,
        invariance=worst,
        probes=probes,
        seconds=time.perf_counter() - start,
    )


def all_texts(qs: QualitySet) -> list[str]:
    """Every text of ``qs`` in the order :func:`against` expects its reference rows."""
    return list(qs.texts) + list(qs.queries) + list(qs.passages) + list(qs.neighbours)


def against(
    ref: npt.NDArray[np.float32],
    candidate: Embed,
    qs: QualitySet,
    *,
    batch_size: int = 32,
    workers: int = 1,
    precision: str = "float32",
) -> Quality:
    """Measure ``candidate`` against the reference's embeddings ``ref`` of :func:`all_texts`.

    Blocks while ``candidate`` embeds every text (``workers`` batches at once) and the
    invariance probes (one pass at a time).

    Args:
        ref: the reference's unit rows for :func:`all_texts` of ``qs``.
        candidate: the engine's batch function.
        qs: the texts.
        batch_size: texts per pass.
        workers: passes at once.
        precision: the candidate's precision (it sets the per-text floor).
    """
    start = time.perf_counter()
    texts = all_texts(qs)
    cand = embed_all(candidate, texts, batch_size=batch_size, workers=workers)
    n, q, p = len(qs.texts), len(qs.queries), len(qs.passages)
    m = len(qs.neighbours)
    compared = np.r_[0:n, n + q + p : n + q + p + m]
    cosines = np.sum(ref[compared] * cand[compared], axis=1)
    agree = 1.0
    if q and p:
        ref_nn = nearest(ref[n : n + q], ref[n + q : n + q + p])
        cand_nn = nearest(cand[n : n + q], cand[n + q : n + q + p])
        agree = sum(a == b for a, b in zip(ref_nn, cand_nn, strict=True)) / q
    kept = overlap = None
    if m:
        kept, overlap = neighbour_agreement(ref[n + q + p :], cand[n + q + p :])
    worst, probes = invariance(candidate, qs.texts, batch_size=batch_size)
    lowest = texts[int(compared[int(np.argmin(cosines))])] if len(compared) else ""
    return Quality(
        texts=len(compared),
        mean_cosine=float(np.mean(cosines)) if len(compared) else 1.0,
        min_cosine=float(np.min(cosines)) if len(compared) else 1.0,
        queries=q,
        ranking_agreement=float(agree),
        neighbours=m,
        nearest_kept=kept,
        top10_overlap=overlap,
        invariance=worst,
        probes=probes,
        seconds=time.perf_counter() - start,
        precision=precision,
        worst_text=lowest[:80],
    )
