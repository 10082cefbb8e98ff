"""Real clients against a real server: huggingface_hub's InferenceClient and the cohere SDK.

Each server is ``batchserve serve --model FOLDER`` in a subprocess on port 0, with a folder
built at test time (a reranker, a classifier) or the built-in MiniLM; the clients are used
exactly as their documentation shows, with the server's URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_helpers import ServerProcess, server_process

pytestmark = pytest.mark.slow

QUERY = "what is a cat"
DOCS = [
    "A cat is a small domesticated carnivorous mammal.",
    "Paris is the capital of France.",
    "Cats sleep for most of the day.",
]


@pytest.fixture(scope="module")
def reranker_server(reranker_folder: Path) -> Iterator[ServerProcess]:
    # The server's defaults, --backend auto included: it measures this folder's engines at
    # start, as a user's first `serve --model FOLDER` does.
    args = ["--model", str(reranker_folder), "--max-wait", "2ms", "--grpc-port", "0"]
    with server_process(args) as server:
        yield server


@pytest.fixture(scope="module")
def classifier_server(classifier_folder: Path) -> Iterator[ServerProcess]:
    # torch: these tests read the protocols (auto's measurement is the reranker's, above)
    args = ["--model", str(classifier_folder), "--backend", "torch", "--max-wait", "2ms"]
    with server_process(args) as server:
        yield server


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Any:
    """huggingface_hub, allowed to reach this local server (the suite runs HF_HUB_OFFLINE=1,
    which blocks every request the library makes, a local URL's included)."""
    module = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(module.constants, "is_offline_mode", lambda: False)
    return module


def _scores(server: ServerProcess) -> dict[int, float]:
    r = httpx.post(f"{server.url}/rerank", json={"query": QUERY, "texts": DOCS})
    r.raise_for_status()
    return {x["index"]: x["score"] for x in r.json()}


def test_cohere_sdk_reranks(reranker_server: ServerProcess) -> None:
    cohere = pytest.importorskip("cohere")
    expected = _scores(reranker_server)
    order = sorted(expected, key=lambda i: -expected[i])
    with httpx.Client() as http:
        v2 = cohere.ClientV2(api_key="unused", base_url=reranker_server.url, httpx_client=http)
        response = v2.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=2)
        v1 = cohere.Client(api_key="unused", base_url=reranker_server.url, httpx_client=http)
        old = v1.rerank(model="rerank-english-v3.0", query=QUERY, documents=DOCS)
    assert [r.index for r in response.results] == order[:2]
    assert response.results[0].relevance_score == pytest.approx(expected[order[0]], abs=1e-6)
    assert [r.index for r in old.results] == order
    assert old.results[0].document is not None
    assert old.results[0].document.text == DOCS[order[0]]


def test_cohere_sdk_ranks_object_documents_by_their_fields(reranker_server: ServerProcess) -> None:
    cohere = pytest.importorskip("cohere")
    docs = [{"title": "Cats", "text": DOCS[0]}, {"title": "France", "text": DOCS[1]}]
    with httpx.Client() as http:
        v1 = cohere.Client(api_key="unused", base_url=reranker_server.url, httpx_client=http)
        out = v1.rerank(
            query=QUERY, documents=docs, rank_fields=["title", "text"], return_documents=True
        )
    # The documents come back whole, their extra fields included.
    assert {(r.document.title, r.document.text) for r in out.results} == {
        (d["title"], d["text"]) for d in docs
    }
    assert [r.relevance_score for r in out.results] == sorted(
        (r.relevance_score for r in out.results), reverse=True
    )


def test_cohere_sdk_reads_the_errors(
    reranker_server: ServerProcess, classifier_server: ServerProcess
) -> None:
    cohere = pytest.importorskip("cohere")
    from cohere.errors import BadRequestError

    with httpx.Client() as http:
        v2 = cohere.ClientV2(api_key="unused", base_url=classifier_server.url, httpx_client=http)
        with pytest.raises(BadRequestError) as caught:
            v2.rerank(model="m", query=QUERY, documents=DOCS)
    assert "is a classifier model" in caught.value.body["message"]


def test_inference_client_classifies(classifier_server: ServerProcess, hub: Any) -> None:
    client = hub.InferenceClient(model=classifier_server.url)
    out = client.text_classification("I love this")
    assert {o.label for o in out} == {"negative", "neutral", "positive"}
    assert sum(o.score for o in out) == pytest.approx(1.0, abs=1e-5)
    top = client.text_classification("I love this", top_k=1)
    assert [o.label for o in top] == [out[0].label]


def test_inference_client_embeds_and_compares(hub: Any) -> None:
    pytest.importorskip("sentence_transformers")
    with server_process(["--backend", "torch", "--max-wait", "2ms"]) as server:
        client = hub.InferenceClient(model=server.url)
        vectors = client.feature_extraction("A cat sat on the mat.")
        assert vectors.shape == (1, 384)
        assert float(np.linalg.norm(vectors[0])) == pytest.approx(1.0, abs=1e-4)
        sims = client.sentence_similarity(
            "A cat sat on the mat.", other_sentences=["A cat sat on the mat.", "Stock prices"]
        )
        assert sims[0] == pytest.approx(1.0, abs=1e-4)
        assert sims[1] < sims[0]


def test_tritonclient_grpc_reranks(reranker_server: ServerProcess, reranker_folder: Path) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    expected = _scores(reranker_server)
    assert reranker_server.grpc is not None
    client = grpcclient.InferenceServerClient(url=reranker_server.grpc)
    try:
        meta = client.get_model_metadata(reranker_folder.name)
        assert [i.name for i in meta.inputs] == ["query", "passage"]
        # Triton's configuration says what the model is and that its items are pairs.
        params = client.get_model_config(reranker_folder.name).config.parameters
        assert params["kind"].string_value == "reranker"
        assert params["item"].string_value == "pair"
        query = grpcclient.InferInput("query", [1, 1], "BYTES")
        query.set_data_from_numpy(np.array([[QUERY.encode()]], dtype=object))
        passage = grpcclient.InferInput("passage", [len(DOCS), 1], "BYTES")
        passage.set_data_from_numpy(np.array([[d.encode()] for d in DOCS], dtype=object))
        result = client.infer(reranker_folder.name, [query, passage])
        scores = result.as_numpy("score")
    finally:
        client.close()
    assert scores.shape == (3, 1)
    assert scores[:, 0].tolist() == pytest.approx([expected[i] for i in range(3)], abs=1e-6)
