"""The quality gate's figures and its bounds, on embedders whose answers are known."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from batchserve.engines.quality import (
    MIN_MEAN_COSINE,
    MIN_RANKING_AGREEMENT,
    Quality,
    compare,
    embed_all,
    nearest,
)
from batchserve.engines.quality_set import QualitySet

TEXTS = tuple(f"text number {i} " + "word " * (i % 7) for i in range(40))
QS = QualitySet(texts=TEXTS, queries=("q0", "q1", "q2", "q3"), passages=("p0", "p1", "p2", "p3"))


def table_embedder(table: dict[str, npt.NDArray[np.float32]], calls: list[int] | None = None):  # type: ignore[no-untyped-def]
    def embed(texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if calls is not None:
            calls.append(len(texts))
        return np.stack([table[t] for t in texts])

    return embed


def random_table(seed: int) -> dict[str, npt.NDArray[np.float32]]:
    rng = np.random.default_rng(seed)
    keys = [*QS.texts, *QS.queries, *QS.passages]
    return {k: rng.normal(size=16).astype(np.float32) for k in keys}


def test_identical_embeddings_pass_with_perfect_figures() -> None:
    table = random_table(1)
    q = compare(table_embedder(table), table_embedder(table), QS)
    assert q.texts == 40
    assert q.queries == 4
    assert q.mean_cosine == pytest.approx(1.0, abs=1e-6)
    assert q.min_cosine == pytest.approx(1.0, abs=1e-6)
    assert q.ranking_agreement == 1.0
    assert q.passes
    assert q.failures() == []


def test_scaled_embeddings_are_the_same_direction() -> None:
    table = random_table(2)
    scaled = {k: 3.0 * v for k, v in table.items()}
    q = compare(table_embedder(table), table_embedder(scaled), QS)
    assert q.mean_cosine == pytest.approx(1.0, abs=1e-6)
    assert q.passes


def test_unrelated_embeddings_fail_both_bounds_and_say_so() -> None:
    q = compare(table_embedder(random_table(3)), table_embedder(random_table(4)), QS)
    assert q.mean_cosine < 0.5
    assert not q.passes
    assert any(f"mean cosine to fp32 must be >= {MIN_MEAN_COSINE}" in f for f in q.failures())


def test_ranking_agreement_counts_queries_whose_nearest_passage_moved() -> None:
    eye = np.eye(4, dtype=np.float32)
    table = {t: np.ones(4, dtype=np.float32) for t in QS.texts}
    table |= {f"q{i}": eye[i] for i in range(4)} | {f"p{i}": eye[i] for i in range(4)}
    moved = dict(table)
    moved["q3"] = eye[0] + 0.01 * eye[3]  # its nearest passage is now p0
    q = compare(table_embedder(table), table_embedder(moved), QS)
    assert q.ranking_agreement == 0.75
    assert q.mean_cosine == pytest.approx(1.0, abs=1e-6)
    assert not q.passes
    assert q.failures() == [
        f"nearest-passage agreement must be >= {MIN_RANKING_AGREEMENT}, got 0.750"
    ]


def test_embed_all_batches_and_keeps_the_order() -> None:
    table = random_table(5)
    calls: list[int] = []
    out = embed_all(table_embedder(table, calls), list(TEXTS), batch_size=16)
    assert calls == [16, 16, 8]
    for i, text in enumerate(TEXTS):
        v = table[text] / np.linalg.norm(table[text])
        assert np.allclose(out[i], v, atol=1e-6)


def test_nearest_and_round_trip_of_the_figures() -> None:
    eye = np.eye(3, dtype=np.float32)
    assert nearest(eye[[2, 0]], eye) == [2, 0]
    q = Quality(texts=3, mean_cosine=0.995, min_cosine=0.97, queries=2, ranking_agreement=1.0)
    assert Quality.from_dict(q.to_dict()) == q
    assert q.to_dict()["passes"] is True
