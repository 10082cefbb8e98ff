"""Cohere's ``/v2/embed`` and ``/v1/embed``, and the quantized types on every embed route.

One in-process app serves a zoo folder (``bert-cls``: prompts ``query`` and ``passage``,
``query`` the default, a 128-token window) on the torch engine; its answers are held to
sentence-transformers in-process: the float vectors to ``SentenceTransformer.encode``'s,
every quantized type byte for byte to ``quantize_embeddings`` of those vectors with the
calibration embeddings the server embedded at load (which are themselves held to
``encode``'s of the calibration texts).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from batchserve_testmodels import vector
from server_helpers import build_app, client_for, embedding_model

from batchserve.engines.calibration import calibration_texts
from batchserve.engines.loader import load_model
from batchserve.models.kinds import Prompts
from batchserve.models.loader import LoadedModel
from batchserve.server import RequestLimits
from batchserve.server.protocols.cohere import PROMPT_NAMES, prompt_for
from batchserve.server.protocols.openai import shorten

st = pytest.importorskip("sentence_transformers")
quantize_embeddings = pytest.importorskip(
    "sentence_transformers.util.quantization"
).quantize_embeddings

TEXTS = [
    "how do batching servers share one forward pass",
    "a cat",
    "",
    "Die Straße führt über die Brücke.",
    "word " * 300,  # over the window: its end is cut
]
QUANTIZED = ("int8", "uint8", "binary", "ubinary")
ALL = ["float", *QUANTIZED, "base64"]


@pytest.fixture(scope="module")
def folder(zoo: Any) -> Path:
    """``bert-cls``: prompts ``query`` (the default) and ``passage``, window 128, unit."""
    path: Path = zoo.folder("bert-cls")
    return path


@pytest.fixture(scope="module")
def loaded(folder: Path) -> LoadedModel:
    """The folder on the torch engine, one thread."""
    return load_model(f"{folder}:backend=torch,threads=1")


@pytest.fixture(scope="module")
def library(folder: Path) -> Any:
    """The folder in sentence-transformers, in-process: the reference."""
    return st.SentenceTransformer(str(folder), device="cpu")


#: The zoo folder declares no Matryoshka dimensions: cutting it takes --any-dimensions.
_ANY_DIMENSIONS = RequestLimits(any_dimensions=True)


@contextlib.asynccontextmanager
async def served(
    model: LoadedModel, limits: RequestLimits | None = None
) -> AsyncIterator[tuple[httpx.AsyncClient, np.ndarray | None]]:
    app = build_app({"m": model}, limits=limits)
    async with client_for(app) as client:
        ready = app.registry.models["m"].loaded
        assert ready is not None
        cal = ready.calibration
        yield client, (cal.embeddings if cal is not None else None)


def _reference(library: Any, texts: list[str], prompt: str | None = None) -> np.ndarray:
    out: np.ndarray = library.encode(texts, prompt_name=prompt, convert_to_numpy=True)
    return out.astype(np.float32)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    num = np.sum(a * b, axis=1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.asarray(num / den)


async def test_every_type_is_quantize_embeddings_of_the_library_s_vectors(
    loaded: LoadedModel, library: Any
) -> None:
    async with served(loaded) as (client, calibration):
        assert calibration is not None
        r = await client.post(
            "/v2/embed",
            json={"model": "embed-v4.0", "texts": TEXTS, "embedding_types": ALL},
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["response_type"] == "embeddings_by_type"
    assert body["texts"] == TEXTS
    assert body["meta"]["api_version"] == {"version": "2"}
    assert body["meta"]["billed_units"]["input_tokens"] > 0
    floats = np.asarray(body["embeddings"]["float"], dtype=np.float32)
    reference = _reference(library, TEXTS)  # the default prompt, as no input_type reads
    assert _cosines(floats, reference).min() >= 0.9999
    # The calibration is the library's vectors of the shipped texts, default prompt.
    cal_reference = _reference(library, list(calibration_texts()))
    assert _cosines(calibration, cal_reference).min() >= 0.9999
    for kind in QUANTIZED:
        got = np.asarray(body["embeddings"][kind])
        for vectors in (floats, reference):
            expected = quantize_embeddings(vectors, kind, calibration_embeddings=calibration)
            assert got.shape == expected.shape, kind
            assert got.astype(expected.dtype).tobytes() == expected.tobytes(), kind
    decoded = [
        np.frombuffer(base64.b64decode(s), dtype="<f4") for s in body["embeddings"]["base64"]
    ]
    assert np.array_equal(np.asarray(decoded), floats)


async def test_output_dimension_quantizes_on_the_calibration_cut_the_same_way(
    loaded: LoadedModel, library: Any
) -> None:
    async with served(loaded, _ANY_DIMENSIONS) as (client, calibration):
        assert calibration is not None
        r = await client.post(
            "/v2/embed",
            json={"texts": TEXTS[:2], "embedding_types": ["float", "int8"], "output_dimension": 16},
        )
    assert r.status_code == 200, r.text
    floats = np.asarray(r.json()["embeddings"]["float"], dtype=np.float32)
    assert floats.shape == (2, 16)
    assert np.allclose(np.linalg.norm(floats, axis=1), 1.0, atol=1e-6)
    reference = np.asarray(shorten(list(_reference(library, TEXTS[:2])), 16), dtype=np.float32)
    cut = np.asarray(shorten(list(calibration), 16), dtype=np.float32)
    expected = quantize_embeddings(reference, "int8", calibration_embeddings=cut)
    assert np.asarray(r.json()["embeddings"]["int8"], dtype=np.int8).tobytes() == expected.tobytes()


@pytest.mark.parametrize(
    ("input_type", "encode"),
    [
        ("search_query", "encode_query"),  # the folder's "query" prompt
        ("search_document", "encode_document"),  # its "document" prompt (empty)
        ("classification", "encode"),  # no such prompt: the default ("query")
        ("clustering", "encode"),
    ],
)
async def test_input_type_is_read_as_the_folder_s_prompt(
    loaded: LoadedModel, library: Any, input_type: str, encode: str
) -> None:
    async with served(loaded) as (client, _):
        r = await client.post("/v2/embed", json={"texts": TEXTS[:2], "input_type": input_type})
    assert r.status_code == 200, r.text
    floats = np.asarray(r.json()["embeddings"]["float"], dtype=np.float32)
    reference = getattr(library, encode)(TEXTS[:2], convert_to_numpy=True)
    assert _cosines(floats, reference).min() >= 0.9999


def _words(library: Any, n: int) -> list[str]:
    # Distinct words the tokenizer has whole: each one token, so a cut between two is exact.
    vocab = library.tokenizer.get_vocab()
    words = sorted(w for w in vocab if w.isalpha() and w.islower() and len(w) >= 3)
    picked = [w for w in words if len(library.tokenizer.tokenize(w)) == 1][:n]
    assert len(picked) == n
    return picked


async def test_truncate_end_start_and_none(loaded: LoadedModel, library: Any) -> None:
    words = _words(library, 200)
    text = " ".join(words)
    prompt_tokens = len(library.tokenizer("query: ", add_special_tokens=False)["input_ids"])
    keep = 128 - 2 - prompt_tokens  # the window less [CLS], [SEP] and the default prompt
    async with served(loaded) as (client, _):
        end = await client.post("/v2/embed", json={"texts": [text], "truncate": "END"})
        default = await client.post("/v2/embed", json={"texts": [text]})
        start = await client.post("/v2/embed", json={"texts": [text, "a cat"], "truncate": "START"})
        none = await client.post("/v2/embed", json={"texts": ["a cat", text], "truncate": "NONE"})
        fits = await client.post("/v2/embed", json={"texts": ["a cat"], "truncate": "NONE"})
    assert end.json()["embeddings"] == default.json()["embeddings"]
    assert end.headers["x-truncated-inputs"] == "1"
    end_vec = np.asarray(end.json()["embeddings"]["float"], dtype=np.float32)
    assert _cosines(end_vec, _reference(library, [" ".join(words[:keep])])).min() >= 0.9999
    assert start.status_code == 200, start.text
    assert "x-truncated-inputs" not in start.headers  # cut to the window before the pass
    start_vec = np.asarray(start.json()["embeddings"]["float"], dtype=np.float32)
    expected = _reference(library, [" ".join(words[-keep:]), "a cat"])
    assert _cosines(start_vec, expected).min() >= 0.9999
    assert start.json()["texts"] == [text, "a cat"]  # the texts as sent
    assert none.status_code == 413
    tokens = 200 + 2 + prompt_tokens
    assert none.json()["message"].startswith(f"texts[1] is {tokens} tokens, over the model's")
    assert fits.status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"texts": []}, 400, "texts must not be empty"),
        ({}, 422, "texts is required"),
        ({"texts": ["a"], "embedding_types": ["int4"]}, 422, "embedding_types[0] must be"),
        ({"texts": ["a"], "embedding_types": []}, 400, "embedding_types must not be empty"),
        ({"texts": ["a"], "embedding_types": "int8"}, 422, "embedding_types must be a list"),
        ({"texts": ["a"], "truncate": "LEFT"}, 422, "truncate must be 'NONE', 'START' or 'END'"),
        ({"texts": ["a"], "input_type": "query"}, 422, "input_type must be"),
        ({"texts": ["a"], "input_type": "image"}, 422, "input_type 'image' is not embedded"),
        ({"images": ["data:image/png;base64,AA=="]}, 422, "images are not embedded here"),
        ({"texts": ["a"], "output_dimension": 64}, 422, "output_dimension must be at most"),
        ({"texts": ["a", "b", "c", "d"]}, 413, "texts must hold at most 3 items"),
        ({"texts": [1]}, 422, "texts[0] must be a string"),
    ],
)
async def test_bad_input_is_refused_naming_the_field(
    loaded: LoadedModel, body: dict[str, Any], status: int, says: str
) -> None:
    async with served(loaded, RequestLimits(max_inputs=3)) as (client, _):
        r = await client.post("/v2/embed", json=body)
    assert r.status_code == status, r.text
    assert says in r.json()["message"]


async def test_v1_answers_floats_without_embedding_types_and_by_type_with(
    loaded: LoadedModel,
) -> None:
    async with served(loaded) as (client, _):
        plain = await client.post("/v1/embed", json={"texts": TEXTS[:2], "model": "x"})
        typed = await client.post(
            "/v1/embed", json={"texts": TEXTS[:2], "embedding_types": ["float", "ubinary"]}
        )
        v2 = await client.post("/v2/embed", json={"texts": TEXTS[:2]})
    assert plain.json()["response_type"] == "embeddings_floats"
    assert plain.json()["embeddings"] == v2.json()["embeddings"]["float"]
    assert plain.json()["meta"]["api_version"] == {"version": "1"}
    assert typed.json()["response_type"] == "embeddings_by_type"
    assert set(typed.json()["embeddings"]) == {"float", "ubinary"}


async def test_openai_and_tei_answer_the_same_types_as_cohere(loaded: LoadedModel) -> None:
    async with served(loaded, _ANY_DIMENSIONS) as (client, _):
        cohere = await client.post("/v2/embed", json={"texts": TEXTS[:2], "embedding_types": ALL})
        by_type = cohere.json()["embeddings"]
        for kind in QUANTIZED:
            openai = await client.post(
                "/v1/embeddings",
                json={"input": TEXTS[:2], "embedding_type": kind, "encoding_format": "float"},
            )
            tei = await client.post("/embed", json={"inputs": TEXTS[:2], "embedding_type": kind})
            assert [d["embedding"] for d in openai.json()["data"]] == by_type[kind], kind
            assert tei.json() == by_type[kind], kind
        b64 = await client.post(
            "/v1/embeddings",
            json={"input": "a", "embedding_type": "int8", "encoding_format": "base64"},
        )
        cut = await client.post(
            "/v1/embeddings",
            json={"input": TEXTS[:2], "embedding_type": "uint8", "dimensions": 16},
        )
        v2_cut = await client.post(
            "/v2/embed",
            json={"texts": TEXTS[:2], "embedding_types": ["uint8"], "output_dimension": 16},
        )
    assert b64.status_code == 422
    assert b64.json()["error"]["param"] == "encoding_format"
    assert [d["embedding"] for d in cut.json()["data"]] == v2_cut.json()["embeddings"]["uint8"]


async def test_a_model_with_no_calibration_refuses_int8_and_packs_bits() -> None:
    model = embedding_model(lambda texts: [vector(t, 8) for t in texts], dim=8)
    async with served(model) as (client, calibration):
        assert calibration is None
        int8 = await client.post("/v2/embed", json={"texts": ["a"], "embedding_types": ["int8"]})
        tei = await client.post("/embed", json={"inputs": ["a"], "embedding_type": "uint8"})
        bits = await client.post(
            "/v2/embed", json={"texts": ["a", "b"], "embedding_types": ["float", "binary"]}
        )
    assert int8.status_code == 422
    assert "embedding_types 'int8' needs the model's calibration" in int8.json()["message"]
    assert tei.status_code == 422
    assert "embedding_type 'uint8'" in tei.json()["error"]
    floats = np.asarray(bits.json()["embeddings"]["float"], dtype=np.float32)
    expected = quantize_embeddings(floats, "binary")
    assert (
        np.asarray(bits.json()["embeddings"]["binary"], dtype=np.int8).tobytes()
        == expected.tobytes()
    )


@pytest.mark.parametrize("backend", ["torch", "onnx", "openvino"])
async def test_every_engine_quantizes_on_its_own_calibration_whatever_the_batch(
    folder: Path, library: Any, engine_cache: Path, backend: str
) -> None:
    # Each engine auto may choose is calibrated on its own vectors; a text's bytes are the
    # same sent alone as among others.
    if backend != "torch":
        pytest.importorskip("onnxruntime" if backend == "onnx" else "openvino")
    model = load_model(f"{folder}:backend={backend},threads=1,cache_dir={engine_cache}")
    async with served(model) as (client, calibration):
        assert calibration is not None
        whole = await client.post("/v2/embed", json={"texts": TEXTS, "embedding_types": ALL})
        alone = [
            (await client.post("/v2/embed", json={"texts": [t], "embedding_types": ALL})).json()
            for t in TEXTS
        ]
    assert whole.status_code == 200, whole.text
    body = whole.json()["embeddings"]
    floats = np.asarray(body["float"], dtype=np.float32)
    assert _cosines(floats, _reference(library, TEXTS)).min() >= 0.9999
    assert _cosines(calibration, _reference(library, list(calibration_texts()))).min() >= 0.9999
    for kind in QUANTIZED:
        expected = np.asarray(quantize_embeddings(floats, kind, calibration_embeddings=calibration))
        assert np.asarray(body[kind], dtype=expected.dtype).tobytes() == expected.tobytes()
        assert [a["embeddings"][kind][0] for a in alone] == body[kind], kind


def test_input_type_names_nomic_s_prompts_first_then_sentence_transformers() -> None:
    nomic = Prompts(
        prompts={k: f"{k}: " for k in ("search_query", "search_document", "clustering")},
        default=None,
    )
    st_names = Prompts(prompts={"query": "q: ", "passage": "p: ", "corpus": "c: "})
    assert [prompt_for(nomic, t) for t in PROMPT_NAMES] == [
        "search_query",
        "search_document",
        None,  # no classification prompt: the default
        "clustering",
    ]
    assert prompt_for(st_names, "search_query") == "query"
    assert prompt_for(st_names, "search_document") == "passage"  # before corpus
    assert prompt_for(None, "search_query") is None
    assert prompt_for(nomic, None) is None


async def test_a_reranker_is_refused_naming_the_route_to_use(reranker: LoadedModel) -> None:
    async with served(reranker) as (client, calibration):
        assert calibration is None  # only an embedder is calibrated
        r = await client.post("/v2/embed", json={"texts": ["a"]})
    assert r.status_code == 400
    assert "/v2/embed" in r.json()["message"]
