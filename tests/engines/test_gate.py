"""The quality gate's cache: the reference computed once (shipped for the built-in model),
each engine's figures once, a set of one's own from the environment."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from batchserve.engines.embeddings import SentenceEmbedder, builtin_path
from batchserve.engines.export import model_folder
from batchserve.engines.gate import (
    QUALITY_SET_ENV,
    default_quality_set,
    gate,
    reference_vectors,
    set_digest,
)
from batchserve.engines.hardware import Engine
from batchserve.engines.quality import all_texts
from batchserve.engines.quality_set import QualitySet
from batchserve.engines.quality_set import load as load_quality_set
from batchserve.engines.runtime import Runtime

SMALL = QualitySet(
    texts=("batching shares a pass", "a lighthouse in the storm", "x"),
    queries=("what shares a pass",),
    passages=("Batching shares one forward pass.", "Bread needs yeast."),
)


def test_the_shipped_reference_is_what_torch_fp32_answers(tmp_path: Path) -> None:
    qs = load_quality_set()
    # an empty cache: the shipped file answers, nothing is computed
    shipped = reference_vectors(builtin_path(), tmp_path, qs)
    assert shipped.shape == (len(all_texts(qs)), 384)
    assert not list(tmp_path.rglob("reference-*.npy"))
    torch_fp32 = SentenceEmbedder.builtin(Runtime(backend="torch", device="cpu", threads=1))
    some = list(range(0, len(all_texts(qs)), 50))
    fresh = torch_fp32([all_texts(qs)[i] for i in some])
    assert np.all(np.sum(fresh * shipped[some], axis=1) >= 0.9999)


class Counting:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.texts = 0

    def __call__(self, texts: Sequence[str]) -> Any:
        self.texts += len(texts)
        return self.model(texts)


def test_an_engines_figures_are_measured_once_and_kept(tmp_path: Path) -> None:
    torch_fp32 = SentenceEmbedder.builtin(Runtime(backend="torch", device="cpu", threads=1))
    candidate = Counting(torch_fp32)
    engine = Engine("torch", "float32")
    first = gate(builtin_path(), engine, candidate, tmp_path, quality_set=SMALL)
    assert (first.texts, first.queries, first.passes) == (3, 1, True)
    assert first.mean_cosine > 0.9999
    assert candidate.texts == len(all_texts(SMALL))
    folder = model_folder(builtin_path(), tmp_path)
    assert (folder / f"reference-{set_digest(SMALL)}.npy").is_file()
    record = folder / "gate" / f"torch-float32-{set_digest(SMALL)}.json"
    assert json.loads(record.read_text())["passes"] is True
    again = gate(builtin_path(), engine, candidate, tmp_path, quality_set=SMALL)
    assert again == first
    assert candidate.texts == len(all_texts(SMALL))  # not embedded again


def test_a_set_of_ones_own_comes_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "mine.txt"
    path.write_text("first text\n\nsecond text\n")
    assert default_quality_set({QUALITY_SET_ENV: str(path)}).texts == ("first text", "second text")
    assert default_quality_set({}) == load_quality_set()
