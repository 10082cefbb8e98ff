"""The model's window as the routes tell it: refusals, truncation counts, token counts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from batchserve.models.kinds import EMBEDDING
from batchserve.models.loader import LoadedModel
from batchserve.server.protocols.window import (
    refuse_over_window,
    token_counts,
    truncated,
    truncated_head,
)
from batchserve.server.statuses import ApiError

WINDOW = 6


class Words:
    """A model's token counts: a word is a token, plus two special tokens; the window cuts."""

    def __init__(self) -> None:
        self.untruncated_calls: list[list[str]] = []

    def count(self, texts: Sequence[Any]) -> list[int]:
        return [min(len(t.split()) + 2, WINDOW) for t in texts]

    def untruncated(self, texts: Sequence[Any]) -> list[int]:
        self.untruncated_calls.append(list(texts))
        return [len(t.split()) + 2 for t in texts]

    def model(self) -> LoadedModel:
        return LoadedModel(
            spec="words",
            fn=lambda texts: texts,
            kind=EMBEDDING,
            count_tokens=self.count,
            untruncated_tokens=self.untruncated,
            max_input_tokens=WINDOW,
        )


def test_only_inputs_over_the_window_count_as_cut_and_only_full_ones_are_recounted() -> None:
    words = Words()
    loaded = words.model()
    texts = ["a b", "a b c d", "a b c d e f g"]  # 4, 6 (exactly the window), 9 tokens
    counts = token_counts(loaded, texts)
    assert counts == [4, 6, 6]
    assert truncated(loaded, texts, counts) == 1
    # The counts come from the pass; only the inputs that reached the window are recounted.
    assert words.untruncated_calls == [["a b c d", "a b c d e f g"]]
    assert truncated_head(loaded, texts) == b"x-truncated-inputs: 1\r\n"
    assert truncated_head(loaded, texts[:2]) == b""
    assert truncated(loaded, ["a"], [3]) == 0
    assert words.untruncated_calls[-1] == ["a b c d"]  # "a" was never recounted


def test_truncate_false_names_the_input_its_tokens_and_the_window() -> None:
    loaded = Words().model()
    refuse_over_window(loaded, ["a b c d"], "inputs")  # exactly the window: kept
    with pytest.raises(ApiError) as info:
        refuse_over_window(loaded, ["a", "a b c d e f g"], "inputs")
    error = info.value
    assert (error.status, error.reason, error.param) == (413, "too_large", "inputs[1]")
    assert error.message == (
        "input 1 is 9 tokens, over the model's window of 6; send truncate=true (the default) "
        "to truncate it"
    )


def test_a_model_that_cannot_count_refuses_nothing_and_reports_no_cut() -> None:
    loaded = LoadedModel(spec="f", fn=lambda t: t, kind=EMBEDDING, max_input_tokens=WINDOW)
    long = ["a " * 100]
    refuse_over_window(loaded, long)
    assert token_counts(loaded, long) is None
    assert truncated(loaded, long, None) == 0
    assert truncated_head(loaded, long) == b""
