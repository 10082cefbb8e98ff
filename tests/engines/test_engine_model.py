"""A model on an engine: a runner and a head composed, tested with plain numbers.

The head here tokenizes a text as one token per character (at most its window of 4) and
groups short texts apart from long ones; the runner answers each item's tokens; the head
doubles them. No torch: what is tested is the composition (groups answered in the items'
order, the token memory, truncation told apart from a full window, the statistics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from batchserve.engines.cuda_graphs import Check, GraphedPasses, cosine_within
from batchserve.engines.model import EngineModel
from batchserve.models.engine import Engine
from batchserve.models.kinds import EMBEDDING
from batchserve.subpasses import ShapeGrid


class CharHead:
    """One token per character, at most 4; texts of under 3 characters grouped apart."""

    kind = EMBEDDING
    width = 2
    window = 4
    tokenizer = None
    left_padded = False
    labels: tuple[str, ...] = ()
    pooling = "mean"
    normalized = False

    def __init__(self) -> None:
        self.counted: list[str] = []

    def groups(self, items: Sequence[Any]) -> list[list[int]]:
        for i, text in enumerate(items):
            if not isinstance(text, str):
                raise TypeError(f"input {i} must be a string, got {type(text).__name__}")
        short = [i for i, t in enumerate(items) if len(t) < 3]
        long = [i for i, t in enumerate(items) if len(t) >= 3]
        return [group for group in (short, long) if group]

    def tokenize(self, items: Sequence[Any]) -> tuple[dict[str, Any], list[int]]:
        counts = [min(len(t), self.window) for t in items]
        width = max(counts)
        mask = np.array([[1] * n + [0] * (width - n) for n in counts], dtype=np.int64)
        return {"input_ids": 7 * mask, "attention_mask": mask}, counts

    def finish(
        self, raw: npt.NDArray[np.float32], features: Mapping[str, Any]
    ) -> npt.NDArray[np.float32]:
        return raw * 2

    def count(self, items: Sequence[Any]) -> list[int]:
        self.counted.extend(items)
        return [min(len(t), self.window) for t in items]

    def untruncated(self, items: Sequence[Any]) -> list[int]:
        return [len(t) for t in items]

    def estimate(self, item: Any) -> int:
        return len(item)

    def key(self, item: Any) -> str:
        return str(item)

    def shaped(self, n: int, width: int) -> dict[str, Any]:
        return self.tokenize(["x" * width] * n)[0]

    def check(self, half: bool) -> Check:
        return cosine_within(0.9999)


class TokenRunner:
    """Each item's tokens (its mask's sum), and a zero."""

    backend, device, dtype, threads = "fake", "cpu", "float32", 1
    graphs: GraphedPasses | None = None
    grid: ShapeGrid | None = None

    def __call__(self, features: Mapping[str, Any]) -> npt.NDArray[np.float32]:
        tokens = np.asarray(features["attention_mask"]).sum(axis=1)
        return np.stack([tokens, np.zeros_like(tokens)], axis=1).astype(np.float32)


@pytest.fixture
def head() -> CharHead:
    return CharHead()


@pytest.fixture
def model(head: CharHead) -> EngineModel:
    return EngineModel(TokenRunner(), head)


def test_each_group_is_a_pass_answered_in_the_items_order(model: EngineModel) -> None:
    rows, counts = model.embed(["ab", "abcdef", "a", "abc"])
    assert rows.tolist() == [[4.0, 0.0], [8.0, 0.0], [2.0, 0.0], [6.0, 0.0]]
    assert counts == [2, 4, 1, 3]
    assert model(["abc"]).tolist() == [[6.0, 0.0]]
    stats = model.statistics()
    assert (stats.passes, stats.real_tokens) == (3, 2 + 1 + 4 + 3 + 3)
    assert model.graph_statistics() is None


def test_no_items_no_pass_and_a_wrong_item_is_refused(model: EngineModel) -> None:
    assert model([]).shape == (0, 2)
    assert model.statistics().passes == 0
    with pytest.raises(TypeError, match="input 1 must be a string"):
        model(["ok", 3])


def test_counts_of_a_pass_are_remembered_others_counted(model: EngineModel, head: CharHead) -> None:
    model(["ab", "abcdef"])
    assert model.count_tokens(["abcdef", "zz", "ab"]) == [4, 2, 2]
    assert head.counted == ["zz"]
    assert model.untruncated_tokens(["abcdef"]) == [6]
    assert model.untruncated_tokens([]) == []
    assert model.token_estimate("abcde") == 5


def test_a_cut_item_is_told_from_one_that_fills_the_window(model: EngineModel) -> None:
    model(["abcdef"])
    assert model.measure(["abcdef", "abcd", "ab"]) == [(4, True), (4, False), (2, False)]


def test_it_states_what_the_server_reads_of_an_engine(model: EngineModel) -> None:
    engine: Engine = model  # the protocol, checked by mypy
    assert (engine.kind, engine.backend, engine.device, engine.dtype) == (
        EMBEDDING,
        "fake",
        "cpu",
        "float32",
    )
    assert (engine.dimension, engine.max_seq_length, engine.labels) == (2, 4, ())
    assert (engine.pooling, engine.normalized, engine.tokenizer) == ("mean", False, None)
    assert engine.statistics().to_dict()["passes"] == 0
