"""The quality gate's figures and its bounds, on embedders whose answers are known.

The index-shaped figures (nearest neighbour kept, top-10 overlap, batch invariance) are
checked on crafted vectors whose rankings are known, and on an embedder that rounds each
pass on a grid its largest value sets, as dynamic int8 does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from batchserve.engines.quality import (
    MIN_INVARIANCE,
    MIN_MEAN_COSINE,
    MIN_NEAREST_KEPT,
    MIN_RANKING_AGREEMENT,
    MIN_TOP10_OVERLAP,
    Quality,
    against,
    compare,
    embed_all,
    invariance,
    itself,
    nearest,
    neighbour_agreement,
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
    q = Quality(
        texts=3, mean_cosine=0.995, min_cosine=0.97, queries=2, ranking_agreement=1.0,
        precision="int8",
    )  # fmt: skip
    assert Quality.from_dict(q.to_dict()) == q
    assert q.to_dict()["passes"] is True  # int8 has no per-text floor


def test_one_text_far_off_fails_the_floor_of_its_precision_whatever_the_mean() -> None:
    # The gate that passed a text at cosine 0.0016 bounded only the mean.
    q = Quality(
        texts=1000, mean_cosine=0.9990, min_cosine=0.0016, queries=2, ranking_agreement=1.0,
        worst_text="a 1,309-token text",
    )  # fmt: skip
    assert q.floor == 0.9999
    assert q.failed_bounds() == ["min cos"]
    assert not q.servable  # at float32 a wrong vector is never served, named or not
    assert q.failures(index=False) == [
        "cosine to torch float32 on every text must be >= 0.9999, got 0.0016 on "
        "'a 1,309-token text'"
    ]
    half = dataclasses.replace(q, precision="bfloat16-mixed", min_cosine=0.9985)
    assert half.floor == 0.999
    assert half.servable  # a reduced precision named on purpose: served with a warning
    assert not half.passes  # ... but never chosen by auto
    assert dataclasses.replace(half, min_cosine=0.9995).passes
    assert Quality.from_dict(q.to_dict()) == q


def unit(rows: npt.ArrayLike) -> npt.NDArray[np.float32]:
    a = np.asarray(rows, dtype=np.float32)
    out: npt.NDArray[np.float32] = a / np.linalg.norm(a, axis=1, keepdims=True)
    return out


def on_a_circle(n: int) -> npt.NDArray[np.float32]:
    """n unit vectors at increasing angles: each one's nearest are its neighbours in angle."""
    angles = np.linspace(0.0, 1.5, n)
    return unit(np.stack([np.cos(angles), np.sin(angles)], axis=1))


def test_the_same_vectors_keep_every_neighbour() -> None:
    rows = unit(np.random.default_rng(0).normal(size=(50, 8)))
    assert neighbour_agreement(rows, rows) == (1.0, 1.0)
    # a scale or a rotation of the whole space changes no ranking
    rotation, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(8, 8)))
    assert neighbour_agreement(rows, unit(rows @ rotation.astype(np.float32))) == (1.0, 1.0)


def test_nearest_kept_counts_the_rows_whose_nearest_other_row_moved() -> None:
    # four points on a line of angles: 0's nearest is 1, 1's is 0 or 2, ...
    ref = unit([[1.0, 0.0], [1.0, 0.10], [1.0, 0.30], [1.0, 0.60]])
    # point 3 moves next to point 0: 3's nearest becomes 0, 0's nearest becomes 3
    cand = ref.copy()
    cand[3] = unit([[1.0, -0.05]])[0]
    kept, _ = neighbour_agreement(ref, cand, k=1)
    # ref nearest: 0->1, 1->0, 2->1, 3->2; cand: 0->3, 1->0, 2->1, 3->0
    assert kept == 0.5


def test_top_k_overlap_is_the_mean_share_of_each_rows_k_nearest_kept() -> None:
    ref = on_a_circle(12)
    assert neighbour_agreement(ref, ref, k=3) == (1.0, 1.0)
    # reverse the order of the last six: rankings inside them hold, those across the seam do
    # not; compute the expected figure by brute force
    cand = ref.copy()
    cand[6:] = ref[6:][::-1]
    k = 3

    def top(rows: npt.NDArray[np.float32]) -> list[set[int]]:
        sims = rows @ rows.T
        np.fill_diagonal(sims, -np.inf)
        return [set(np.argsort(-s, kind="stable")[:k].tolist()) for s in sims]

    want = np.mean([len(a & b) / k for a, b in zip(top(ref), top(cand), strict=True)])
    kept, overlap = neighbour_agreement(ref, cand, k=k, block=5)  # blocks cut across rows
    assert overlap == pytest.approx(want)
    assert 0.0 < overlap < 1.0
    assert kept < 1.0


def test_neighbour_agreement_on_tiny_sets_and_mismatched_shapes() -> None:
    one = unit([[1.0, 0.0]])
    assert neighbour_agreement(one, one) == (1.0, 1.0)
    two = unit([[1.0, 0.0], [0.0, 1.0]])
    assert neighbour_agreement(two, two) == (1.0, 1.0)  # k shrinks to n - 1
    with pytest.raises(ValueError, match="one shape"):
        neighbour_agreement(two, one)


MANY = tuple(f"text {i} " + "word " * (i % 9) for i in range(80))


def fixed(texts: Sequence[str]) -> npt.NDArray[np.float32]:
    # a text's vector depends on the text alone
    return np.stack([np.array([len(t), 1.0, t.count("word") + 1.0], np.float32) for t in texts])


def per_pass_scale(texts: Sequence[str]) -> npt.NDArray[np.float32]:
    # dynamic int8: every value rounded on a grid whose step the whole pass sets
    exact = fixed(texts) + np.array([0.0, 0.37, 0.0], np.float32)
    step = np.abs(exact).max() / 7.0
    out: npt.NDArray[np.float32] = (np.round(exact / step) * step).astype(np.float32)
    return out


def test_an_engine_whose_vectors_depend_on_the_batch_fails_invariance() -> None:
    worst, probes = invariance(fixed, MANY)
    assert worst == pytest.approx(1.0, abs=1e-6)
    assert probes == 64
    worst, probes = invariance(per_pass_scale, MANY)
    assert probes == 64
    assert worst < 0.999
    assert invariance(fixed, ()) == (1.0, 0)


def test_invariance_probes_span_the_lengths_and_meet_new_batch_mates() -> None:
    seen: list[list[str]] = []

    def record(texts: Sequence[str]) -> npt.NDArray[np.float32]:
        seen.append(list(texts))
        return fixed(texts)

    invariance(record, MANY, probes=8, batch_size=4, rounds=2)
    alone, batches = seen[:8], seen[8:]
    assert all(len(a) == 1 for a in alone)
    probes = [a[0] for a in alone]
    assert min(map(len, probes)) == min(map(len, MANY))
    assert max(map(len, probes)) == max(map(len, MANY))
    assert [len(b) for b in batches] == [4, 4, 4, 4]
    assert sorted(t for b in batches[:2] for t in b) == sorted(probes)
    assert batches[:2] != batches[2:]  # the second round shuffles again


WITH_NEIGHBOURS = QualitySet(
    texts=MANY,
    queries=("q0",),
    passages=("p0", "p1"),
    neighbours=tuple(f"paragraph {i}" for i in range(30)),
)


def table(seed: int, texts: Sequence[str]) -> dict[str, npt.NDArray[np.float32]]:
    rng = np.random.default_rng(seed)
    return {t: rng.normal(size=16).astype(np.float32) for t in texts}


def test_against_measures_every_figure_and_the_gate_says_which_bound_failed() -> None:
    qs = WITH_NEIGHBOURS
    everything = [*qs.texts, *qs.queries, *qs.passages, *qs.neighbours]
    vectors = table(3, everything)
    ref = unit(np.stack([vectors[t] for t in everything]))

    def same(texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.stack([vectors[t] for t in texts])

    q = against(ref, same, qs)
    assert (q.texts, q.queries, q.neighbours, q.probes) == (110, 1, 30, 64)
    assert (q.nearest_kept, q.top10_overlap) == (1.0, 1.0)
    assert q.invariance == pytest.approx(1.0, abs=1e-6)
    assert q.passes
    assert q.servable
    # the neighbours shuffled among themselves: each keeps its meaning's cosine elsewhere,
    # but the paragraphs' neighbourhoods are gone
    shuffled = dict(vectors)
    names = list(qs.neighbours)
    for a, b in zip(names, names[1:] + names[:1], strict=True):
        shuffled[a] = vectors[b]
    q = against(ref, lambda texts: np.stack([shuffled[t] for t in texts]), qs)
    assert q.nearest_kept is not None
    assert q.nearest_kept < MIN_NEAREST_KEPT
    assert "NN" in q.failed_bounds()
    assert "top-10" in q.failed_bounds()


def test_the_bounds_each_fail_alone_and_only_meaning_refuses_a_named_engine() -> None:
    good = Quality(
        texts=10, mean_cosine=0.995, min_cosine=0.97, queries=4, ranking_agreement=1.0,
        neighbours=100, nearest_kept=0.97, top10_overlap=0.93, invariance=0.99995, probes=64,
        precision="int8",
    )  # fmt: skip
    assert good.passes
    assert good.servable
    assert good.failures() == []
    cases = {
        "nearest_kept": (0.90, "NN", "nearest neighbour kept must be >= 95%, got 90.0%"),
        "top10_overlap": (0.85, "top-10", f"top-10 overlap must be >= {MIN_TOP10_OVERLAP}"),
        "invariance": (0.974, "invariance", f"must be >= {MIN_INVARIANCE}, got 0.974000"),
    }
    for field, (value, short, phrase) in cases.items():
        q = dataclasses.replace(good, **{field: value})  # type: ignore[arg-type]
        assert not q.passes, field
        assert q.servable, field  # an index-shaped bound: still served when asked by name
        assert q.failed_bounds() == [short]
        assert len(q.failures()) == 1
        assert phrase in q.failures()[0]
        assert q.failures(index=False) == []
    poor = dataclasses.replace(good, mean_cosine=0.95)
    assert not poor.servable
    assert poor.failed_bounds() == ["mean cos"]
    # a set without neighbours has no such figures, and no such bound
    alone = dataclasses.replace(good, neighbours=0, nearest_kept=None, top10_overlap=None)
    assert alone.passes
    assert Quality.from_dict(good.to_dict()) == good
    assert Quality.from_dict(alone.to_dict()) == alone
    old = {k: v for k, v in good.to_dict().items() if k != "invariance"}
    with pytest.raises(KeyError):
        Quality.from_dict(old)  # an older gate's file: measured again


def test_the_reference_against_itself_measures_only_its_invariance() -> None:
    calls: list[int] = []

    def counted(texts: Sequence[str]) -> npt.NDArray[np.float32]:
        calls.append(len(texts))
        return fixed(texts)

    q = itself(counted, WITH_NEIGHBOURS)
    assert (q.mean_cosine, q.nearest_kept, q.top10_overlap, q.ranking_agreement) == (1, 1, 1, 1)
    assert q.invariance == pytest.approx(1.0, abs=1e-6)
    assert sum(calls) == 64 + 2 * 64  # the probes alone, then twice in batches: nothing else
