"""Every folder of the zoo, on every engine this machine offers, gives the library's vectors.

The zoo (``tests/zoo.py``) holds a tiny random-weight folder of each family (BERT,
DistilBERT, RoBERTa, XLM-R, MPNet, ModernBERT with an 8,192-token window, Qwen2 and Qwen3
decoders with left padding), each pooling (CLS, mean, max, mean over the square root of the
length, weighted mean, last token), a ``Dense``, prompts pooled and kept out of the pooling,
and each layout (sentence-transformers 6's save, the files of versions 2 to 5, a bare
``save_pretrained``). Each is loaded as the server loads it (``load_model``, the engine
named: its gate runs too) on torch and on every exported engine (ONNX Runtime and OpenVINO
at float32, OpenVINO at bfloat16 where the CPU computes in it), and every vector it gives
the texts at the model's edges (past the window, past 512 tokens, spaces around, the empty
string, many scripts, each prompt) is held to ``SentenceTransformer.encode``'s, in-process:
cosine >= 0.9999 (0.999 at half precision), the length within 1e-3 (1e-2).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from engine_fixtures import Zoo
from zoo import ZOO, Spec

pytest.importorskip("sentence_transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")

from batchserve.engines.edges import EdgeText, cosine_floor, edge_texts, inputs, norm_bound
from batchserve.engines.exported import on_exported
from batchserve.engines.hardware import Machine, precision_support
from batchserve.engines.loader import load_model
from batchserve.engines.pipeline import TextPipeline
from batchserve.engines.runtime import Runtime

#: Texts beside the edge set: whitespace inside and alone, a long one with a prompt.
MORE = (
    EdgeText(label="whitespace alone", text="   "),
    EdgeText(label="lines and runs of spaces", text="first line\n\nsecond   line\t end"),
    EdgeText(label="a passage", text="Batching groups requests that arrive close together. " * 3),
)


def engines() -> list[tuple[str, str]]:
    """The engines a user may name here: torch, and the exported ones at each precision."""
    out = [("torch", "float32"), ("onnx", "float32"), ("openvino", "float32")]
    if precision_support("bfloat16", "cpu", Machine.here()) is None:
        out.append(("openvino", "bfloat16"))
    return out


def expected_pooling(spec: Spec) -> str:
    if spec.layout == "bare":  # what sentence-transformers builds for a bare base model
        return "mean"
    return spec.pooling


def library_vectors(library: Any, items: Sequence[EdgeText]) -> npt.NDArray[np.float64]:
    out = np.zeros((len(items), library.get_embedding_dimension()))
    for name in {i.prompt_name for i in items}:
        rows = [k for k, i in enumerate(items) if i.prompt_name == name]
        out[rows] = library.encode([items[k].text for k in rows], prompt_name=name, batch_size=1)
    return out


@pytest.mark.parametrize("spec", ZOO, ids=[s.name for s in ZOO])
def test_every_engine_gives_each_edge_text_the_librarys_vector(
    spec: Spec,
    zoo: Zoo,
    engine_cache: Path,
) -> None:
    from sentence_transformers import SentenceTransformer

    folder = zoo.folder(spec.name)
    library = SentenceTransformer(str(folder), device="cpu")
    pipeline = TextPipeline.read(folder)
    # the folder as the library reads it
    assert pipeline.pooling == expected_pooling(spec)
    assert (pipeline.normalized, pipeline.include_prompt) == (spec.normalized, spec.include_prompt)
    assert pipeline.window == library.max_seq_length
    assert pipeline.padding_side == library.tokenizer.padding_side
    assert pipeline.dimension == library.get_embedding_dimension()
    items = [*edge_texts(pipeline), *MORE]
    longest = max(pipeline.untruncated([i.text for i in items]))
    assert longest > min(pipeline.window, 8192)  # past the window, or past 8,192 tokens
    want = library_vectors(library, items)
    # the set tells the texts apart: an engine that gave one text another's vector fails
    unit = want / np.linalg.norm(want, axis=1, keepdims=True)
    similar = unit @ unit.T
    assert np.min(similar) < 0.99
    texts = inputs(items, pipeline)
    counts: list[int] | None = None
    for backend, dtype in engines():
        if dtype == "float32":  # as the server loads it, its gate on the edge texts included
            model = load_model(f"{folder}:backend={backend},dtype={dtype},cache_dir={engine_cache}")
            assert (model.pooling, model.normalized) == (pipeline.pooling, spec.normalized)
            assert model.max_input_tokens == pipeline.window
            assert model.engine is not None
            assert model.engine["gate"]["edges"]["passes"]
            fn: Any = model.fn
        else:  # a reduced precision's whole gate is test_exported's; the vectors are here
            runtime = Runtime(backend=backend, dtype=dtype, cache_dir=str(engine_cache))
            fn = on_exported(folder, runtime, gated=False)
        got = np.asarray(fn(texts), dtype=np.float64)
        assert got.shape == want.shape
        cos = (
            np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        )
        err = np.abs(np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1) - 1)
        floor, bound = cosine_floor(dtype), norm_bound(dtype)
        assert floor is not None
        assert bound is not None
        missed = [(items[k].label, round(float(c), 6)) for k, c in enumerate(cos) if c < floor]
        assert missed == [], f"{backend}/{dtype}"
        assert float(np.max(err)) <= bound, f"{backend}/{dtype}"
        got_counts = fn.count_tokens(texts)
        counts = counts or got_counts
        assert got_counts == counts, f"{backend}/{dtype}"  # every engine counts as torch


def test_a_vector_is_unit_length_only_where_the_folder_ends_in_normalize(zoo: Zoo) -> None:
    for name, normalized in (("roberta-max", False), ("bert-cls", True)):
        model = load_model(f"{zoo.folder(name)}:backend=torch")
        norms = np.linalg.norm(np.asarray(model.fn(["a text", "another one"])), axis=1)
        assert model.normalized is normalized
        assert np.allclose(norms, 1.0, atol=1e-5) is normalized, name
