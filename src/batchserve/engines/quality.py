"""The quality gate: how close a backend's embeddings stay to the fp32 reference.

Theory of operation: a reduced-precision backend (int8) is only offered if it keeps the
meaning of its embeddings. :func:`compare` embeds the same texts with the reference (fp32)
and the candidate, in batches, and measures

* the cosine of each text's two embeddings: their mean and minimum over the set;
* the retrieval agreement: each query of a retrieval set is ranked against all passages
  by cosine, and the query counts as agreeing when its nearest passage is the same under
  both models (the fraction of agreeing queries).

The gate passes when the mean cosine is at least :data:`MIN_MEAN_COSINE` and the retrieval
agreement at least :data:`MIN_RANKING_AGREEMENT`. The figures are what ``batchserve
profile`` prints beside each backend's cost curve, and what the export cache stores
beside an int8 model so the gate runs once per model, not at every start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from batchserve.engines.quality_set import QualitySet

__all__ = [
    "MIN_MEAN_COSINE",
    "MIN_RANKING_AGREEMENT",
    "Quality",
    "against",
    "all_texts",
    "compare",
    "embed_all",
    "nearest",
]

#: The gate's bound on the mean cosine to the fp32 embeddings.
MIN_MEAN_COSINE = 0.99
#: The gate's bound on the fraction of queries whose nearest passage is unchanged.
MIN_RANKING_AGREEMENT = 0.95

Embed = Callable[[Sequence[str]], npt.NDArray[np.float32]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Quality:
    """A candidate's embeddings against the reference's.

    Attributes:
        texts: how many texts were compared.
        mean_cosine: mean over the texts of the cosine between the two embeddings.
        min_cosine: the smallest such cosine.
        queries: how many retrieval queries were ranked.
        ranking_agreement: the fraction of queries whose nearest passage is the same.
    """

    texts: int
    mean_cosine: float
    min_cosine: float
    queries: int
    ranking_agreement: float

    @property
    def passes(self) -> bool:
        """Whether the gate passes (both bounds met)."""
        return (
            self.mean_cosine >= MIN_MEAN_COSINE and self.ranking_agreement >= MIN_RANKING_AGREEMENT
        )

    def failures(self) -> list[str]:
        """One phrase per bound missed, naming the figure, the rule and the value."""
        out = []
        if self.mean_cosine < MIN_MEAN_COSINE:
            out.append(
                f"mean cosine to fp32 must be >= {MIN_MEAN_COSINE}, got {self.mean_cosine:.4f}"
            )
        if self.ranking_agreement < MIN_RANKING_AGREEMENT:
            out.append(
                f"nearest-passage agreement must be >= {MIN_RANKING_AGREEMENT}, "
                f"got {self.ranking_agreement:.3f}"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values, with ``passes``."""
        return {
            "texts": self.texts,
            "mean_cosine": self.mean_cosine,
            "min_cosine": self.min_cosine,
            "queries": self.queries,
            "ranking_agreement": self.ranking_agreement,
            "passes": self.passes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Quality:
        """Read back what :meth:`to_dict` wrote."""
        return cls(
            texts=int(data["texts"]),
            mean_cosine=float(data["mean_cosine"]),
            min_cosine=float(data["min_cosine"]),
            queries=int(data["queries"]),
            ranking_agreement=float(data["ranking_agreement"]),
        )


def embed_all(
    embed: Embed, texts: Sequence[str], *, batch_size: int = 32, workers: int = 1
) -> npt.NDArray[np.float32]:
    """Embed ``texts`` in batches of ``batch_size``, in order; rows are unit length.

    Texts are sorted by length before batching (and put back in order after), so that
    padding costs little; an embedding does not depend on its batch. ``workers`` batches
    run at once on as many threads (for a model that releases the GIL, as every engine
    here does).
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
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    unit: npt.NDArray[np.float32] = (out / np.maximum(norms, 1e-12)).astype(np.float32)
    return unit


def nearest(queries: npt.NDArray[np.float32], passages: npt.NDArray[np.float32]) -> list[int]:
    """For each (unit) query row, the index of the passage row of highest cosine."""
    return [int(i) for i in np.argmax(queries @ passages.T, axis=1)]


def compare(reference: Embed, candidate: Embed, qs: QualitySet, *, batch_size: int = 32) -> Quality:
    """Measure ``candidate`` against ``reference`` on ``qs`` (see the module docstring).

    Blocks while both embed every text, query and passage (seconds to a minute on a CPU).
    """
    ref = embed_all(reference, all_texts(qs), batch_size=batch_size)
    return against(ref, candidate, qs, batch_size=batch_size)


def all_texts(qs: QualitySet) -> list[str]:
    """Every text of ``qs`` in the order :func:`against` expects its reference rows."""
    return list(qs.texts) + list(qs.queries) + list(qs.passages)


def against(
    ref: npt.NDArray[np.float32],
    candidate: Embed,
    qs: QualitySet,
    *,
    batch_size: int = 32,
    workers: int = 1,
) -> Quality:
    """Measure ``candidate`` against the reference's embeddings ``ref`` of :func:`all_texts`.

    Blocks while ``candidate`` embeds every text, query and passage (``workers`` batches at
    once).
    """
    cand = embed_all(candidate, all_texts(qs), batch_size=batch_size, workers=workers)
    n, q = len(qs.texts), len(qs.queries)
    cosines = np.sum(ref[:n] * cand[:n], axis=1)
    agree = 1.0
    if q and qs.passages:
        ref_nn = nearest(ref[n : n + q], ref[n + q :])
        cand_nn = nearest(cand[n : n + q], cand[n + q :])
        agree = sum(a == b for a, b in zip(ref_nn, cand_nn, strict=True)) / q
    return Quality(
        texts=n,
        mean_cosine=float(np.mean(cosines)) if n else 1.0,
        min_cosine=float(np.min(cosines)) if n else 1.0,
        queries=q,
        ranking_agreement=float(agree),
    )
