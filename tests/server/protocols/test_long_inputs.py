"""Inputs longer than the model's window, split into windows and pooled, on every embedding route.

The reference: the same windows embedded by ``SentenceTransformer.encode`` in-process (its
own default prompt applied), pooled by the same rule (a mean weighted by each window's
tokens, special tokens and prompt included, then unit length where the folder ends in
``Normalize``); cosine >= 0.9999. Zoo folders on torch: mean pooling with a 64-token
window (WordPiece, lower case), CLS pooling with a default prompt (128), and max pooling
without ``Normalize`` (byte-level BPE, 512); and the first on onnx, what ``--backend auto``
chose for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import build_app, client_for

from batchserve.config import BatchConfig
from batchserve.models.kinds import PromptedText, apply_prompt
from batchserve.models.loader import LoadedModel
from batchserve.server import RequestLimits
from batchserve.server.protocols.long_inputs import Windows, split_windows
from engine_fixtures import Zoo

pytest.importorskip("sentence_transformers")

from batchserve.engines.loader import load_model

#: A long text of words and sub-words (``unbelievably`` is several WordPiece tokens), in
#: several scripts, and a short one that stays one item.
WORDS = "Die Straße führt unbelievably far; 東京は日本の首都. tokenization-heavy words"
LONG = " ".join(f"{WORDS} {i}" for i in range(60))
SHORT = "a short text"
FOLDERS = ["distilbert-mean-legacy", "bert-cls", "roberta-max"]
#: The engine ``--backend auto`` chose for the 64-token folder on the 2-core CPU it was
#: written on (onnx/float32); its windows are texts like any other, held to the library.
ONNX = "distilbert-mean-legacy@onnx"


@pytest.fixture(scope="module")
def models(zoo: Zoo, engine_cache: Path) -> dict[str, tuple[Path, LoadedModel]]:
    out = {
        name: (zoo.folder(name), load_model(f"{zoo.folder(name)}:backend=torch,threads=1"))
        for name in FOLDERS
    }
    folder = zoo.folder("distilbert-mean-legacy")
    spec = f"{folder}:backend=onnx,threads=1,cache_dir={engine_cache}"
    out[ONNX] = (folder, load_model(spec))
    assert (out[ONNX][1].engine or {})["backend"] == "onnx"
    return out


def _reference(folder: Path, windows: Windows) -> list[np.ndarray]:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device="cpu")
    pieces = [w.text if isinstance(w, PromptedText) else str(w) for w in windows.items]
    vectors = st.encode(pieces, convert_to_numpy=True)  # its default prompt, as encode applies
    prompt = st.prompts.get(st.default_prompt_name or "") or ""
    tokens = st.tokenize([prompt + p for p in pieces])["attention_mask"].sum(dim=1).numpy()
    unit = any(type(m).__name__ == "Normalize" for m in st)
    out = []
    for start, stop in windows.spans:
        rows, weights = vectors[start:stop].astype(np.float64), tokens[start:stop]
        vector = weights @ rows / weights.sum()
        if unit and stop - start > 1:
            vector = vector / np.linalg.norm(vector)
        out.append(vector)
    return out


def _cos(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", [*FOLDERS, ONNX])
async def test_split_windows_pooled_equal_encode_of_the_same_windows(
    models: dict[str, tuple[Path, LoadedModel]], name: str
) -> None:
    folder, loaded = models[name]
    overlap = 8
    texts = apply_prompt([LONG, SHORT], loaded.prompts, None)
    windows = split_windows(loaded, texts, overlap)
    assert windows is not None
    assert windows.split == 1
    assert windows.spans[1][1] - windows.spans[1][0] == 1  # the short text: one item
    window = loaded.max_input_tokens
    assert window is not None
    assert loaded.untruncated_tokens is not None
    lengths = loaded.untruncated_tokens(windows.items)
    assert max(lengths) <= window  # every window fits, its special tokens and prompt included
    start, stop = windows.spans[0]
    assert stop - start >= 3
    # The windows cover the text, in order, each starting before the last one ended.
    pieces = [w.text if isinstance(w, PromptedText) else w for w in windows.items[start:stop]]
    assert LONG.startswith(pieces[0])
    assert LONG.endswith(pieces[-1])
    at = 0
    for piece in pieces:
        found = LONG.find(piece, at)
        assert found >= at
        at = found + 1
    want = _reference(folder, windows)

    body = {"input": [LONG, SHORT], "long_inputs": {"split": True, "overlap": overlap}}
    app = build_app({"m": loaded})
    async with client_for(app) as c:
        openai = await c.post("/v1/embeddings", json=body)
        infinity = await c.post("/embeddings", json={**body, "model": "m"})
        tei = await c.post(
            "/embed",
            json={"inputs": [LONG, SHORT], "truncate": False, "long_inputs": body["long_inputs"]},
        )
    for r in (openai, infinity, tei):
        assert r.status_code == 200, r.text
    # The request's items are its windows: one timing value per window, usage of windows.
    assert len(openai.headers["x-batch-size"].split(",")) == len(windows.items)
    assert loaded.count_tokens is not None
    assert openai.json()["usage"]["prompt_tokens"] == sum(loaded.count_tokens(windows.items))
    assert "x-truncated-inputs" not in openai.headers
    assert int(tei.headers["x-compute-tokens"]) == sum(loaded.count_tokens(windows.items))
    got = [d["embedding"] for d in openai.json()["data"]]
    for g, w in zip(got, want, strict=True):
        assert _cos(g, w) >= 0.9999
    for g, other in zip(got, [d["embedding"] for d in infinity.json()["data"]], strict=True):
        assert _cos(g, other) >= 0.99999
    for g, other in zip(got, tei.json(), strict=True):
        assert _cos(g, other) >= 0.99999  # TEI's normalize scales; the direction is the same


async def test_the_default_truncates_and_truncate_false_alone_is_413(
    models: dict[str, tuple[Path, LoadedModel]],
) -> None:
    _, loaded = models["distilbert-mean-legacy"]
    assert loaded.untruncated_tokens is not None
    tokens = loaded.untruncated_tokens([LONG])[0]
    app = build_app({"m": loaded})
    async with client_for(app) as c:
        cut = await c.post("/v1/embeddings", json={"input": LONG})
        refused = await c.post("/embed", json={"inputs": ["x", LONG], "truncate": False})
        unsplit = await c.post(
            "/embed",
            json={"inputs": [LONG], "truncate": False, "long_inputs": {"split": False}},
        )
        zero = await c.post(
            "/v1/embeddings", json={"input": LONG, "long_inputs": {"split": True, "overlap": 0}}
        )
    assert cut.status_code == 200
    assert cut.headers["x-truncated-inputs"] == "1"
    assert cut.headers["x-batch-size"].count(",") == 0
    assert refused.status_code == 413
    assert f"input 1 is {tokens} tokens, over the model's window of 64" in refused.text
    assert "long_inputs" in refused.text  # the route that can split says how
    assert unsplit.status_code == 413
    assert zero.status_code == 200


async def test_bad_long_inputs_and_the_queue_bound_are_refused(
    models: dict[str, tuple[Path, LoadedModel]],
) -> None:
    _, loaded = models["distilbert-mean-legacy"]
    app = build_app({"m": loaded}, batch={"m": BatchConfig(queue_size=4)})
    async with client_for(app) as c:
        wide = await c.post(
            "/v1/embeddings", json={"input": LONG, "long_inputs": {"split": True, "overlap": 62}}
        )
        negative = await c.post(
            "/v1/embeddings", json={"input": LONG, "long_inputs": {"split": True, "overlap": -1}}
        )
        shape = await c.post("/embed", json={"inputs": LONG, "long_inputs": True})
        many = await c.post("/v1/embeddings", json={"input": LONG, "long_inputs": {"split": True}})
        tei_many = await c.post("/embed", json={"inputs": LONG, "long_inputs": {"split": True}})
    assert wide.status_code == 422
    assert wide.json()["error"]["param"] == "long_inputs.overlap"
    assert "less than the tokens one window holds" in wide.text
    assert negative.status_code == 422
    assert negative.json()["error"]["param"] == "long_inputs.overlap"
    assert shape.status_code == 422
    assert "long_inputs" in shape.text
    assert many.status_code == 413
    assert "windows" in many.text
    assert "--queue-size" in many.text
    assert tei_many.status_code == 413


async def test_a_text_over_max_input_chars_is_cut_when_truncating(
    models: dict[str, tuple[Path, LoadedModel]],
) -> None:
    _, loaded = models["distilbert-mean-legacy"]
    most = 300
    assert len(LONG) > most
    app = build_app({"m": loaded}, limits=RequestLimits(max_input_chars=most))
    async with client_for(app) as c:
        whole = await c.post("/v1/embeddings", json={"input": [LONG, SHORT]})
        prefix = await c.post("/v1/embeddings", json={"input": [LONG[:most], SHORT]})
        tei = await c.post("/embed", json={"inputs": LONG})
        infinity = await c.post("/embeddings", json={"input": LONG, "model": "m"})
        tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": [LONG]}
        kserve = await c.post("/v2/models/m/infer", json={"inputs": [tensor]})
        strict = await c.post("/embed", json={"inputs": LONG, "truncate": False})
        strict_params = await c.post(
            "/embed", json={"inputs": LONG, "parameters": {"truncate": False}}
        )
        split = await c.post("/v1/embeddings", json={"input": LONG, "long_inputs": {"split": True}})
    assert whole.status_code == 200, whole.text
    assert whole.json()["data"] == prefix.json()["data"]  # cut to the limit, then embedded
    assert tei.status_code == 200
    assert infinity.status_code == 200
    assert kserve.status_code == 200, kserve.text
    for r in (strict, strict_params, split):  # the whole text was asked for: refused, named
        assert r.status_code == 413, r.text
        assert f"at most {most} characters (--max-input-chars)" in r.text


async def test_the_openai_client_sends_long_inputs_as_extra_body(
    models: dict[str, tuple[Path, LoadedModel]],
) -> None:
    # openai 3.60's embeddings.create has no such field: extra_body adds it to the JSON.
    openai = pytest.importorskip("openai")
    import httpx

    _, loaded = models["distilbert-mean-legacy"]
    app = build_app({"m": loaded})
    async with client_for(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport) as http:
            client = openai.AsyncOpenAI(
                base_url="http://batchserve/v1", api_key="none", http_client=http
            )
            split = await client.embeddings.create(
                model="m", input=[LONG], extra_body={"long_inputs": {"split": True, "overlap": 4}}
            )
            cut = await client.embeddings.create(model="m", input=[LONG])
    windows = split_windows(loaded, [LONG], 4)
    assert windows is not None
    assert loaded.count_tokens is not None
    assert split.usage.prompt_tokens == sum(loaded.count_tokens(windows.items))
    assert cut.usage.prompt_tokens == 64  # truncated to the window
    assert _cos(split.data[0].embedding, cut.data[0].embedding) < 0.9999  # not the same vector
