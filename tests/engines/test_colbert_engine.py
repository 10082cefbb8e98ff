"""The multi-vector (ColBERT) kind on torch, against PyLate in-process.

A random-weight ColBERT folder as PyLate 1.6 saves it (``tests/colbert_folder.py``); every
token vector of every text, as a query and as a document, against ``ColBERT.encode``'s
(cosine >= 0.9999, the same tokens kept), and MaxSim against ``pylate.rank.rerank``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pylate")

# PyLate 1.6 imports sentence-transformers 5's module paths, deprecated in 6.
pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)

from batchserve.engines.loader import load_model  # noqa: E402
from batchserve.errors import ConfigError  # noqa: E402
from batchserve.models.kinds import MULTIVECTOR, Marked, folder_kind, maxsim, unpack  # noqa: E402

TEXTS = [
    "hello world",
    "",
    "What is the capital of France, and why?",
    "a long document about many things. " * 30,
    "Tokyo; Paris! Berlin? (Rome)",
    "机器学习让计算机从数据中学习规律。",
    "  spaces around  ",
]


@pytest.fixture(scope="module")
def served(colbert_dir: Path) -> Any:
    return load_model(str(colbert_dir))


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(
        (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1), dtype=np.float64
    )


@pytest.mark.parametrize("is_query", [True, False])
def test_every_token_vector_is_pylate_s(served: Any, pylate_colbert: Any, is_query: bool) -> None:
    expected = pylate_colbert.encode(TEXTS, is_query=is_query)
    rows = served.fn([Marked(t, is_query) for t in TEXTS])
    for text, want, row in zip(TEXTS, expected, rows, strict=True):
        got = unpack(row)
        assert got.shape == want.shape, text
        assert _cosines(got, want).min() >= 0.9999, text


def test_a_query_alone_is_expanded_to_query_length(served: Any, pylate_colbert: Any) -> None:
    want = pylate_colbert.encode(["cat"], is_query=True)[0]
    got = unpack(served.fn([Marked("cat", True)])[0])
    assert got.shape == want.shape == (12, 16)
    assert _cosines(got, want).min() >= 0.9999


def test_a_plain_string_is_a_document(served: Any) -> None:
    a = served.fn(["Tokyo; Paris!"])[0]
    b = served.fn([Marked("Tokyo; Paris!", False)])[0]
    assert np.array_equal(unpack(a), unpack(b))


def test_maxsim_ranks_as_pylate(served: Any, pylate_colbert: Any) -> None:
    from pylate import rank

    query, docs = TEXTS[2], TEXTS[:2] + TEXTS[3:]
    q = pylate_colbert.encode([query], is_query=True)
    d = pylate_colbert.encode(docs, is_query=False)
    ranked = rank.rerank(
        documents_ids=[list(range(len(docs)))], queries_embeddings=q, documents_embeddings=[d]
    )[0]
    rows = served.fn([Marked(query, True), *(Marked(t, False) for t in docs)])
    scores = maxsim(unpack(rows[0]), [unpack(r) for r in rows[1:]])
    assert [r["id"] for r in ranked] == sorted(range(len(docs)), key=lambda i: -scores[i])
    for r in ranked:
        assert scores[int(r["id"])] == pytest.approx(float(r["score"]), rel=1e-4)


def test_batch_invariance(served: Any) -> None:
    # Each text alone, and in a mixed batch of queries and documents of every length.
    items = [Marked(t, i % 2 == 0) for i, t in enumerate(TEXTS * 2)]
    together = served.fn(items)
    for item, row in zip(items, together, strict=True):
        alone = unpack(served.fn([item])[0])
        got = unpack(row)
        assert got.shape == alone.shape
        assert _cosines(got, alone).min() >= 0.9999


def test_folder_kind_and_loaded_model(colbert_dir: Path, served: Any) -> None:
    assert folder_kind(colbert_dir).kind is MULTIVECTOR
    assert served.kind is MULTIVECTOR
    assert served.engine["backend"] == "torch"


def test_exported_backend_is_refused(colbert_dir: Path) -> None:
    with pytest.raises(ConfigError, match="backend onnx does not run a multi-vector"):
        load_model(f"{colbert_dir}:backend=onnx")


def test_other_multi_vector_folders_are_refused(colbert_dir: Path, tmp_path: Path) -> None:
    import shutil

    other = tmp_path / "other"
    shutil.copytree(colbert_dir, other)
    modules = json.loads((other / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "", "type": "x.Pooling"})
    (other / "modules.json").write_text(json.dumps(modules))
    found = folder_kind(other)
    assert found.refusal is not None
    assert "Transformer, then Dense" in found.refusal
    st = tmp_path / "st"
    shutil.copytree(colbert_dir, st)
    config = json.loads((st / "config_sentence_transformers.json").read_text())
    (st / "modules.json").write_text(json.dumps(modules[:1]))
    config["model_type"] = "MultiVectorEncoder"
    (st / "config_sentence_transformers.json").write_text(json.dumps(config))
    found = folder_kind(st)
    assert found.refusal is not None
    assert "multi-vector encoder" in found.refusal
