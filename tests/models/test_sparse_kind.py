"""The sparse kind: SPLADE folders read, refused and served equal to ``SparseEncoder.encode``.

Tiny random-weight folders (``tests/sparse_zoo.py``) of every layout, on torch (the only
engine ``auto`` chooses for the kind): each text's nonzero terms are the library's and
their weights within 1e-4 relative; a text alone gets the row it gets among others of
other lengths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from sparse_zoo import LAYOUTS, build_sparse_folder

pytest.importorskip("sentence_transformers")

from batchserve.engines.loader import load_model
from batchserve.engines.runtime import Runtime
from batchserve.errors import ConfigError
from batchserve.models.kinds import SPARSE, SPLADE, folder_kind, splade_kind
from batchserve.models.loader import LoadedModel

#: Texts of many lengths, one past the st5 folder's 64-token window, and an empty one.
TEXTS = [
    "what is dynamic batching",
    "",
    "Sparse retrieval weighs the words of a text; SPLADE expands them with related terms.",
    "x",
    " ".join(["a long passage about servers and queues and deadlines"] * 12),
    "東京は日本の首都です。",
    "The quick brown fox jumps over the lazy dog.",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse")
    return {layout: build_sparse_folder(root / layout, layout=layout) for layout in LAYOUTS}


def spec(folder: Path, layout: str) -> str:
    options = "backend=torch,threads=1" + (",pooling=splade" if layout == "bare" else "")
    return f"{folder}:{options}"


def reference(folder: Path, texts: list[str], **kwargs: Any) -> npt.NDArray[np.float32]:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(folder), device="cpu")
    rows = model.encode(texts, convert_to_sparse_tensor=False, convert_to_tensor=True, **kwargs)
    return np.asarray(rows.numpy(), dtype=np.float32)


def run(model: LoadedModel, items: list[Any]) -> npt.NDArray[np.float32]:
    """One pass of the model's engine over ``items``."""
    assert model.on_engine is not None
    return np.asarray(model.on_engine(items), dtype=np.float32)


def assert_same_terms(got: npt.NDArray[np.float32], want: npt.NDArray[np.float32]) -> None:
    """Every row keeps the library's terms, each weight within 1e-4 relative.

    A weight near zero (``log1p`` of a logit just over zero) is held to 1e-7 absolute
    instead: float32 rounds the logits it comes from by about 3e-8 whatever their size.
    """
    assert got.shape == want.shape
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(np.flatnonzero(g), np.flatnonzero(w)), f"row {i}: other terms"
        kept = w != 0
        bound = np.maximum(1e-4 * np.abs(w[kept]), 1e-7)
        assert np.all(np.abs(g[kept] - w[kept]) <= bound), f"row {i}"


def test_a_sparse_encoder_folder_is_the_sparse_kind(folders: dict[str, Path]) -> None:
    for layout in ("st6", "st5", "sum"):
        found = folder_kind(folders[layout])
        assert found.kind is SPARSE, layout
        assert found.refusal is None, layout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_is_served_as_sparse_encoder_encodes(
    folders: dict[str, Path], layout: str
) -> None:
    folder = folders[layout]
    model = load_model(spec(folder, layout))
    assert model.kind is SPARSE
    want = reference(folder, TEXTS)
    assert model.dimension == want.shape[1]
    got = run(model, TEXTS)
    assert_same_terms(got, want)
    kept = (want != 0).sum(axis=1)
    assert kept.min() > 0
    assert kept.max() < want.shape[1] // 10
    from sentence_transformers import SparseEncoder

    assert model.max_input_tokens == SparseEncoder(str(folder), device="cpu").max_seq_length


def test_a_text_alone_gets_the_row_it_gets_among_others(folders: dict[str, Path]) -> None:
    model = load_model(spec(folders["st6"], "st6"))
    together = run(model, TEXTS)
    for i, text in enumerate(TEXTS):
        alone = run(model, [text])[0]
        assert np.array_equal(np.flatnonzero(alone), np.flatnonzero(together[i]))
        assert np.allclose(alone, together[i], rtol=1e-5, atol=1e-6)


def test_prompts_are_prepended_as_encode_prepends_them(folders: dict[str, Path]) -> None:
    from batchserve.models.kinds import apply_prompt

    model = load_model(spec(folders["st6"], "st6"))
    assert model.prompts is not None
    assert model.prompts.prompts["query"] == "query: "
    items = apply_prompt(TEXTS[:3], model.prompts, "query")
    assert_same_terms(run(model, items), reference(folders["st6"], TEXTS[:3], prompt_name="query"))


def test_auto_serves_torch_and_an_exported_engine_is_refused(folders: dict[str, Path]) -> None:
    model = load_model(f"{folders['st6']}:threads=1")  # backend auto
    assert model.engine is not None
    assert model.engine["backend"] == "torch"
    with pytest.raises(ConfigError, match="sparse embedder is served on torch only"):
        load_model(f"{folders['st6']}:backend=onnx,threads=1")


def test_a_bare_masked_lm_is_refused_without_pooling_splade(folders: dict[str, Path]) -> None:
    found = folder_kind(folders["bare"])
    assert found.refusal is not None
    assert "--pooling splade" in found.refusal
    with pytest.raises(ConfigError, match="--pooling splade"):
        load_model(f"{folders['bare']}:backend=torch")
    assert splade_kind(folders["bare"]).kind is SPARSE


def test_pooling_splade_names_a_bare_masked_lm_only(
    folders: dict[str, Path], reranker_folder: Path
) -> None:
    with pytest.raises(ConfigError, match="a sentence-transformers folder"):
        splade_kind(folders["st6"])
    with pytest.raises(ConfigError, match="BertForSequenceClassification, with no masked-LM"):
        load_model(f"{reranker_folder}:backend=torch,pooling={SPLADE}")
    with pytest.raises(ConfigError, match="pooling must be splade, got 'mean'"):
        Runtime(pooling="mean")


def test_a_sparse_encoder_of_other_modules_is_refused_naming_them(tmp_path: Path) -> None:
    # Inference-free SPLADE: a Router of a SparseStaticEmbedding (queries) and a masked-LM
    # transformer (documents).
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
    (tmp_path / "config_sentence_transformers.json").write_text(
        json.dumps({"model_type": "SparseEncoder"})
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.Router"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.modules.SpladePooling"},
    ]  # fmt: skip
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    found = folder_kind(tmp_path)
    assert found.refusal is not None
    assert "SparseEncoder of modules Router, SpladePooling" in found.refusal
    assert "inference-free" in found.refusal
    with pytest.raises(ConfigError, match="Router"):
        load_model(f"{tmp_path}:backend=torch")
