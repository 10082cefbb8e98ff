"""A ColBERT folder served: TEI's /embed_all, MaxSim on every rerank shape, KServe, errors.

In-process (the app over ASGI) against PyLate's own ``ColBERT.encode`` and
``pylate.rank.rerank`` on the same random-weight folder (``tests/colbert_folder.py``); and
the cohere SDK against ``batchserve serve --model FOLDER`` in a subprocess.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_helpers import ServerProcess, build_app, client_for, server_process

pytest.importorskip("pylate")

from batchserve.engines.loader import load_model
from batchserve.models.loader import LoadedModel

# PyLate 1.6 imports sentence-transformers 5's module paths, deprecated in 6.
pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)

QUERY = "what is a cat"
DOCS = [
    "A cat is a small domesticated carnivorous mammal.",
    "Paris is the capital of France.",
    "Cats sleep for most of the day; they hunt at night!",
    "",
]


@pytest.fixture(scope="module")
def colbert(colbert_dir: Path) -> LoadedModel:
    return load_model(str(colbert_dir))


def _pylate_ranking(pylate_colbert: Any, query: str, docs: list[str]) -> dict[int, float]:
    from pylate import rank

    q = pylate_colbert.encode([query], is_query=True)
    d = pylate_colbert.encode(docs, is_query=False)
    ranked = rank.rerank(
        documents_ids=[list(range(len(docs)))], queries_embeddings=q, documents_embeddings=[d]
    )[0]
    return {int(r["id"]): float(r["score"]) for r in ranked}


def _close(got: list[list[float]], want: np.ndarray) -> None:
    a = np.asarray(got, dtype=np.float64)
    assert a.shape == want.shape
    cos = (a * want).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999


@pytest.mark.parametrize("is_query", [False, True])
async def test_embed_all_is_pylate_s_encode(
    colbert: LoadedModel, pylate_colbert: Any, is_query: bool
) -> None:
    async with client_for(build_app({"cb": colbert})) as c:
        r = await c.post("/embed_all", json={"inputs": DOCS, "is_query": is_query})
        one = await c.post("/embed_all", json={"inputs": DOCS[0], "is_query": is_query})
    assert r.status_code == 200, r.text
    want = pylate_colbert.encode(DOCS, is_query=is_query)
    for got, expected in zip(r.json(), want, strict=True):
        _close(got, expected)
    assert len(one.json()) == 1
    _close(one.json()[0], want[0])


async def test_every_rerank_shape_answers_from_maxsim(
    colbert: LoadedModel, pylate_colbert: Any
) -> None:
    want = _pylate_ranking(pylate_colbert, QUERY, DOCS)
    order = sorted(want, key=lambda i: -want[i])
    body = {"model": "colbert", "query": QUERY, "documents": DOCS}
    async with client_for(build_app({"cb": colbert})) as c:
        tei = await c.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
        inf = await c.post("/rerank", json={**body, "return_documents": True})
        v2 = await c.post("/v2/rerank", json={**body, "top_n": 2})
        v1 = await c.post("/v1/rerank", json={**body, "documents": [{"text": d} for d in DOCS]})
    for r in (tei, inf, v2, v1):
        assert r.status_code == 200, r.text
    assert [x["index"] for x in tei.json()] == order
    for x in tei.json():
        assert x["score"] == pytest.approx(want[x["index"]], rel=1e-4)
        assert x["text"] == DOCS[x["index"]]
    assert [x["index"] for x in inf.json()["results"]] == order
    assert inf.json()["results"][0]["document"] == DOCS[order[0]]
    assert [x["index"] for x in v2.json()["results"]] == order[:2]
    assert v2.json()["results"][0]["relevance_score"] == pytest.approx(want[order[0]], rel=1e-4)
    assert [x["index"] for x in v1.json()["results"]] == order
    assert v1.json()["usage"]["total_tokens"] > 0
    # One query and four passages are five items, encoded in one pass.
    assert tei.headers["x-batch-size"].split(",") == ["5"] * 5


async def test_kserve_answers_padded_vectors_and_counts(
    colbert: LoadedModel, pylate_colbert: Any
) -> None:
    body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": DOCS[:2]}]}
    async with client_for(build_app({"cb": colbert})) as c:
        meta = (await c.get("/v2/models/cb")).json()
        r = await c.post("/v2/models/cb/infer", json=body)
    assert r.status_code == 200, r.text
    assert [o["name"] for o in meta["outputs"]] == ["token_embeddings", "token_counts"]
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    vectors = np.asarray(outputs["token_embeddings"]["data"], dtype=np.float64)
    vectors = vectors.reshape(outputs["token_embeddings"]["shape"])
    counts = outputs["token_counts"]["data"]
    want = pylate_colbert.encode(DOCS[:2], is_query=False)
    assert counts == [len(w) for w in want]
    for i, w in enumerate(want):
        _close(vectors[i, : counts[i]].tolist(), w)
    query = {**body, "parameters": {"is_query": True}}
    async with client_for(build_app({"cb": colbert})) as c:
        r = await c.post("/v2/models/cb/infer", json=query)
        bad = await c.post("/v2/models/cb/infer", json={**body, "outputs": [{"name": "x"}]})
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    want = pylate_colbert.encode(DOCS[:2], is_query=True)
    assert outputs["token_counts"]["data"] == [12, 12]
    vectors = np.asarray(outputs["token_embeddings"]["data"], dtype=np.float64).reshape(2, 12, 16)
    for i, w in enumerate(want):
        _close(vectors[i].tolist(), w)
    assert bad.status_code == 422
    assert "token_counts" in bad.json()["error"]


async def test_wrong_kind_and_bad_input(colbert: LoadedModel) -> None:
    async with client_for(build_app({"cb": colbert})) as c:
        embed = await c.post("/embed", json={"inputs": "x"})
        openai = await c.post("/v1/embeddings", json={"input": "x", "model": "cb"})
        flag = await c.post("/embed_all", json={"inputs": ["x"], "is_query": "yes"})
        missing = await c.post("/embed_all", json={"is_query": True})
        texts = await c.post("/embed_all", json={"inputs": [1]})
        predict = await c.post("/predict", json={"inputs": "x"})
    assert embed.status_code == 400
    assert "/embed_all" in embed.json()["error"]
    assert openai.status_code == 400
    assert "multivector" in openai.text
    assert predict.status_code == 400
    for r, field in ((flag, "is_query"), (missing, "inputs"), (texts, "inputs")):
        assert r.status_code == 422, r.text
        assert field in r.json()["error"]


@pytest.fixture(scope="module")
def colbert_server(colbert_dir: Path) -> Iterator[ServerProcess]:
    # The server's defaults, --backend auto included (torch, for this kind).
    with server_process(["--model", str(colbert_dir), "--max-wait", "2ms"]) as server:
        yield server


@pytest.mark.slow
def test_cohere_sdk_reranks_with_maxsim(colbert_server: ServerProcess, pylate_colbert: Any) -> None:
    cohere = pytest.importorskip("cohere")
    want = _pylate_ranking(pylate_colbert, QUERY, DOCS)
    order = sorted(want, key=lambda i: -want[i])
    with httpx.Client() as http:
        v2 = cohere.ClientV2(api_key="unused", base_url=colbert_server.url, httpx_client=http)
        response = v2.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=3)
        v1 = cohere.Client(api_key="unused", base_url=colbert_server.url, httpx_client=http)
        old = v1.rerank(model="rerank-english-v3.0", query=QUERY, documents=DOCS)
    assert [r.index for r in response.results] == order[:3]
    assert response.results[0].relevance_score == pytest.approx(want[order[0]], rel=1e-4)
    assert [r.index for r in old.results] == order
    assert old.results[0].document is not None
    assert old.results[0].document.text == DOCS[order[0]]


async def test_root_info_and_the_window(colbert: LoadedModel, pylate_colbert: Any) -> None:
    long = "word " * 100  # past document_length (40 tokens)
    async with client_for(build_app({"cb": colbert})) as c:
        root = await c.post("/", json={"inputs": DOCS[:1]})
        info = (await c.get("/info")).json()
        cut = await c.post("/embed_all", json={"inputs": [long]})
        refused = await c.post("/embed_all", json={"inputs": ["a", long], "truncate": False})
    assert root.status_code == 200, root.text
    _close(root.json()[0], pylate_colbert.encode(DOCS[:1], is_query=False)[0])
    assert info["kind"] == "multivector"
    assert info["max_input_length"] == 40
    assert cut.status_code == 200
    assert cut.headers["x-truncated-inputs"] == "1"
    assert refused.status_code == 413
    assert "input 1 is" in refused.json()["error"]
    assert "window of 40" in refused.json()["error"]
