"""An LLM reranker behind every rerank route, and the cohere SDK against it.

``batchserve serve --model FOLDER`` in a subprocess on port 0 with the tiny Qwen3 LLM
reranker of ``batchserve_testing.llm_reranker`` (``--backend auto``: torch, the one engine for the
kind); each route's scores are the model card's recipe's, one pair at a time in-process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import ServerProcess, server_process

pytest.importorskip("transformers")

from batchserve_testing import llm_reranker

pytestmark = pytest.mark.slow

QUERY = "what is a cat"
DOCS = [
    "A cat is a small domesticated carnivorous mammal.",
    "Paris is the capital of France.",
    "Cats sleep for most of the day.",
    "",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llm_reranker.build(tmp_path_factory.mktemp("llm-served"))


@pytest.fixture(scope="module")
def expected(folder: Path) -> dict[int, float]:
    reference = llm_reranker.Reference(folder)
    return {i: reference(QUERY, d) for i, d in enumerate(DOCS)}


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    args = ["--model", str(folder), "--max-wait", "2ms", "--grpc-port", "0"]
    with server_process(args) as server:
        yield server


def _close(got: dict[int, float], want: dict[int, float]) -> None:
    assert set(got) == set(want)
    assert max(abs(got[i] - want[i]) for i in want) <= 1e-3
    assert sorted(got, key=lambda i: -got[i]) == sorted(want, key=lambda i: -want[i])


def test_tei_and_infinity_rerank(server: ServerProcess, expected: dict[int, float]) -> None:
    r = httpx.post(f"{server.url}/rerank", json={"query": QUERY, "texts": DOCS})
    assert r.status_code == 200, r.text
    _close({x["index"]: x["score"] for x in r.json()}, expected)
    r = httpx.post(f"{server.url}/rerank", json={"query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    _close({x["index"]: x["relevance_score"] for x in r.json()["results"]}, expected)


def test_raw_scores_are_the_log_odds(server: ServerProcess, expected: dict[int, float]) -> None:
    import math

    body = {"query": QUERY, "texts": DOCS, "raw_scores": True}
    r = httpx.post(f"{server.url}/rerank", json=body)
    assert r.status_code == 200, r.text
    raw = {x["index"]: x["score"] for x in r.json()}
    _close({i: 1.0 / (1.0 + math.exp(-s)) for i, s in raw.items()}, expected)


def test_predict_scores_pairs_and_refuses_a_text(
    server: ServerProcess, expected: dict[int, float]
) -> None:
    r = httpx.post(f"{server.url}/predict", json={"inputs": [[QUERY, DOCS[0]]]})
    assert r.status_code == 200, r.text
    assert r.json()[0][0]["score"] == pytest.approx(expected[0], abs=1e-3)
    r = httpx.post(f"{server.url}/predict", json={"inputs": "just a text"})
    assert 400 <= r.status_code < 500, r.text
    assert "pair" in r.text


def test_cohere_sdk_reranks(server: ServerProcess, expected: dict[int, float]) -> None:
    cohere = pytest.importorskip("cohere")
    order = sorted(expected, key=lambda i: -expected[i])
    with httpx.Client() as http:
        v2 = cohere.ClientV2(api_key="unused", base_url=server.url, httpx_client=http)
        response = v2.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=2)
        v1 = cohere.Client(api_key="unused", base_url=server.url, httpx_client=http)
        old = v1.rerank(model="rerank-english-v3.0", query=QUERY, documents=DOCS)
    assert [r.index for r in response.results] == order[:2]
    assert response.results[0].relevance_score == pytest.approx(expected[order[0]], abs=1e-3)
    got: dict[int, Any] = {r.index: r.relevance_score for r in old.results}
    _close(got, expected)


def test_kserve_scores_pairs(server: ServerProcess, expected: dict[int, float]) -> None:
    body = {
        "inputs": [
            {"name": "query", "shape": [1], "datatype": "BYTES", "data": [QUERY]},
            {"name": "passage", "shape": [3], "datatype": "BYTES", "data": DOCS[:3]},
        ]
    }
    r = httpx.post(f"{server.url}/v2/models/llm-reranker/infer", json=body)
    assert r.status_code == 200, r.text
    scores = r.json()["outputs"][0]["data"]
    _close(dict(enumerate(scores)), {i: expected[i] for i in range(3)})  # KServe: none empty
