"""The kinds as values: what each one means, the one activation, and the lookups."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchserve.models.kinds import (
    ACTIVATIONS,
    BY_NAME,
    CLASSIFIER,
    EMBEDDING,
    GENERIC,
    ITEMS,
    KINDS,
    NONE,
    RERANKER,
    ROUTES,
    SIGMOID,
    SOFTMAX,
    Logits,
    Sparse,
    Tensors,
    Tokens,
    Vector,
    item_of,
    kind_named,
    wrong_kind,
)


def test_each_kind_says_what_it_is() -> None:
    table: dict[str, tuple[object, ...]] = {
        k.name: (k.item, type(k.head), k.activation.name, k.prompts, k.tasks, k.gate)
        for k in BY_NAME.values()
    }
    expected: dict[str, tuple[object, ...]] = {
        "embedding": ("text", Vector, "none", True, ("embed",), "cosine"),
        "reranker": ("pair", Logits, "sigmoid", False, ("rerank",), "order"),
        "classifier": ("text", Logits, "softmax", False, ("classify",), "label"),
        "generic": (None, Tensors, "none", False, (), None),
        "sparse": ("text", Sparse, "none", True, ("embed_sparse",), None),
        "multivector": ("text", Tokens, "none", False, ("embed", "rerank"), None),
    }
    assert table == expected
    assert (EMBEDDING.head.output, RERANKER.head.output, CLASSIFIER.head.output) == (
        "embedding",
        "score",
        "probabilities",
    )
    # Warmed up with one of its own items; an imported function is not warmed up.
    assert isinstance(EMBEDDING.warmup, str)
    assert RERANKER.warmup == (EMBEDDING.warmup, EMBEDDING.warmup)
    assert GENERIC.warmup is None


def test_the_lookups_are_read_from_the_kinds() -> None:
    assert KINDS == ("embedding", "reranker", "classifier", "generic", "sparse", "multivector")
    assert ROUTES["reranker"][0] == "POST /rerank"
    assert {k.name: k.routes for k in BY_NAME.values()} == ROUTES
    assert ITEMS == ("pair", "text")
    assert (item_of(RERANKER), item_of(CLASSIFIER), item_of(GENERIC), item_of(None)) == (
        "pair",
        "text",
        None,
        None,
    )
    assert all(kind_named(name) is kind for name, kind in BY_NAME.items())
    with pytest.raises(ValueError, match="kind must be one of embedding, reranker, "):
        kind_named("nonesuch")
    # One value per kind, compared by identity: a set of kinds is a set of those values.
    assert len({*BY_NAME.values(), *BY_NAME.values()}) == 6


def test_a_wrong_kind_names_the_route_to_use() -> None:
    assert wrong_kind("ce", RERANKER, "POST /embed") == (
        "model 'ce' is a reranker model and does not answer POST /embed; use POST /rerank"
    )
    assert wrong_kind("g", GENERIC, "POST /rerank").endswith("use POST /v2/models/g/infer")
    assert "is an embedding model" in wrong_kind("e", EMBEDDING, "POST /rerank")


def test_one_activation_over_the_last_axis() -> None:
    logits = np.array([[0.5], [-2.0], [-800.0]])
    want = [1 / (1 + math.exp(-0.5)), 1 / (1 + math.exp(2.0)), 0.0]
    assert SIGMOID(logits)[:, 0].tolist() == pytest.approx(want, abs=1e-15)
    rows = np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, 0.0]])
    probabilities = SOFTMAX(rows)
    assert probabilities.sum(axis=-1).tolist() == pytest.approx([1.0, 1.0])
    assert probabilities[1].tolist() == pytest.approx([0.5, 0.5, 0.0])
    # One item's logits (a row) give that row of the pass's matrix.
    assert SOFTMAX(rows[0]).tolist() == probabilities[0].tolist()
    assert NONE([1.5, -1.0]).tolist() == [1.5, -1.0]
    assert ACTIVATIONS == {"sigmoid": SIGMOID, "softmax": SOFTMAX, "none": NONE}
    # A kind's scores: its own activation, or the logits as they are when raw.
    assert RERANKER.activate([0.0]).tolist() == [0.5]
    assert RERANKER.activate([0.0], raw=True).tolist() == [0.0]
    assert CLASSIFIER.scoring(raw=False) is SOFTMAX
    assert CLASSIFIER.scoring(raw=True) is NONE
