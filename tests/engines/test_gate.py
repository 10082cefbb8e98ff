"""The quality gate's cache: the reference computed once (shipped for the built-in model),
each engine's figures once, a set of one's own from the environment; the neighbours from
Python's reference manual, their reference part computed once and kept beside the shipped one."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from batchserve.engines.corpus import reference_paragraphs
from batchserve.engines.edges import edge_texts
from batchserve.engines.embeddings import builtin, builtin_path
from batchserve.engines.export import model_folder
from batchserve.engines.gate import (
    QUALITY_SET_ENV,
    default_quality_set,
    gate,
    reference_vectors,
    set_digest,
)
from batchserve.engines.hardware import REFERENCE, Engine
from batchserve.engines.pipeline import TextPipeline
from batchserve.engines.quality import all_texts
from batchserve.engines.quality_set import QualitySet, neighbour_paragraphs
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
    torch_fp32 = builtin(Runtime(backend="torch", device="cpu", threads=1))
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
    torch_fp32 = builtin(Runtime(backend="torch", device="cpu", threads=1))
    candidate = Counting(torch_fp32)
    engine = Engine("torch", "bfloat16-mixed")  # its name keys the figures; torch fp32 runs
    first = gate(builtin_path(), engine, candidate, tmp_path, quality_set=SMALL)
    assert (first.texts, first.queries, first.probes, first.passes) == (3, 1, 3, True)
    assert first.mean_cosine > 0.9999
    assert first.invariance >= 0.9999
    # every text once, the three invariance probes alone and twice in a batch, and the
    # texts at the model's edges once, against sentence-transformers itself
    edges = edge_texts(TextPipeline.read(builtin_path()))
    embedded = len(all_texts(SMALL)) + 3 + 2 * 3 + len(edges)
    assert candidate.texts == embedded
    assert first.edges is not None
    assert (first.edges.texts, first.edges.floor, first.edges.passes) == (len(edges), 0.999, True)
    folder = model_folder(builtin_path(), tmp_path)
    assert (folder / f"reference-{set_digest(SMALL)}.npy").is_file()
    record = folder / "gate" / f"torch-bfloat16-mixed-{set_digest(SMALL)}.json"
    assert json.loads(record.read_text())["passes"] is True
    again = gate(builtin_path(), engine, candidate, tmp_path, quality_set=SMALL)
    assert again == first
    assert candidate.texts == embedded  # not embedded again


def test_a_set_of_ones_own_comes_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "mine.txt"
    path.write_text("first text\n\nsecond text\n")
    assert default_quality_set({QUALITY_SET_ENV: str(path)}).texts == ("first text", "second text")
    assert default_quality_set({}).texts == load_quality_set().texts
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"texts": ["a"], "neighbours": ["b", "c"]}))
    assert default_quality_set({QUALITY_SET_ENV: str(mine)}).neighbours == ("b", "c")


def test_the_neighbours_are_the_reference_manuals_longer_paragraphs() -> None:
    paragraphs = neighbour_paragraphs()
    assert len(paragraphs) >= 1000  # 1,456 on CPython 3.11
    assert len(set(paragraphs)) == len(paragraphs)
    assert all(len(p.split()) >= 8 for p in paragraphs)
    assert sum("assert" in p for p in paragraphs) >= 5  # many on one topic: close neighbours
    # the benches' text, the short paragraphs left out, in its order
    assert paragraphs == tuple(p for p in reference_paragraphs() if len(p.split()) >= 8)
    # the default set carries them; a set of one's own brings its own, or none
    assert default_quality_set({}).neighbours == paragraphs


WITH_NEIGHBOURS = dataclasses.replace(
    SMALL, neighbours=("A paragraph on batching.", "A paragraph on batches.", "On bread.")
)


def test_the_reference_is_kept_in_parts_the_shipped_one_from_the_package(
    tmp_path: Path,
) -> None:
    qs = dataclasses.replace(load_quality_set(), neighbours=WITH_NEIGHBOURS.neighbours)
    vectors = reference_vectors(builtin_path(), tmp_path, qs)
    assert vectors.shape == (len(all_texts(qs)), 384)
    # only the neighbours were computed: the shipped set's part came with the package
    kept = list(tmp_path.rglob("reference-*.npy"))
    assert len(kept) == 1
    assert np.load(kept[0]).shape == (3, 384)
    torch_fp32 = builtin(Runtime(backend="torch", device="cpu", threads=1))
    fresh = torch_fp32(list(qs.neighbours))
    assert np.all(np.sum(fresh * vectors[-3:], axis=1) >= 0.9999)
    # read back, not computed again
    kept[0].write_bytes(kept[0].read_bytes())
    before = kept[0].stat().st_mtime_ns
    again = reference_vectors(builtin_path(), tmp_path, qs)
    assert np.array_equal(again, vectors)
    assert kept[0].stat().st_mtime_ns == before


def test_the_reference_engine_is_gated_for_its_invariance_and_edges_alone(tmp_path: Path) -> None:
    torch_fp32 = builtin(Runtime(backend="torch", device="cpu", threads=1))
    q = gate(builtin_path(), REFERENCE, torch_fp32, tmp_path, quality_set=WITH_NEIGHBOURS)
    assert q.invariance >= 0.9999
    assert (q.nearest_kept, q.probes, q.passes) == (1.0, 3, True)
    # held to sentence-transformers itself on the edge texts, to the float32 floor
    assert q.edges is not None
    assert (q.edges.floor, q.edges.passes) == (0.9999, True)
    assert q.edges.min_cosine >= 0.9999
    assert not list(tmp_path.rglob("reference-*.npy"))  # no reference needed for itself
