"""Rerankers and classifiers served in-process: the task APIs' shapes, statuses and batching."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import build_app, client_for, embedding_model

from batchserve.config import BatchConfig, CostEstimate
from batchserve.errors import ConfigError
from batchserve.models.kinds import BY_NAME, ITEMS, Prompts, folder_prompts, item_of
from batchserve.models.loader import LoadedModel
from batchserve.models.matryoshka import Matryoshka
from batchserve.server import RequestLimits

pytest.importorskip("transformers")

QUERY = "what is a cat"
DOCS = [
    "A cat is a small domesticated carnivorous mammal.",
    "Paris is the capital of France.",
    "Cats sleep for most of the day and hunt at dawn and dusk.",
]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _expected(reranker: LoadedModel, docs: list[str]) -> list[float]:
    logits = reranker.fn([(QUERY, d) for d in docs])
    return [float(v) for v in np.asarray(logits)[:, 0]]


async def _client(models: dict[str, Any], **kw: Any) -> AsyncIterator[Any]:
    async with client_for(build_app(models, **kw)) as c:
        yield c


async def test_tei_rerank_sorts_by_score_with_the_model_s_own_scores(
    reranker: LoadedModel,
) -> None:
    app = build_app({"ce": reranker})
    async with client_for(app) as c:
        r = await c.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
        assert r.status_code == 200, r.text
        ranks = r.json()
        raw = await c.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True})
    logits = _expected(reranker, DOCS)
    assert [x["index"] for x in ranks] == sorted(range(3), key=lambda i: -logits[i])
    for rank in ranks:
        assert rank["score"] == pytest.approx(_sigmoid(logits[rank["index"]]), abs=1e-5)
        assert rank["text"] == DOCS[rank["index"]]
    assert {x["index"]: x["score"] for x in raw.json()} == pytest.approx(
        dict(enumerate(logits)), abs=1e-5
    )
    # One request of three passages is three items, all in one pass here.
    assert r.headers["x-batch-size"].split(",") == ["3", "3", "3"]


async def test_cohere_jina_and_infinity_rerank_shapes(reranker: LoadedModel) -> None:
    app = build_app({"ce": reranker})
    body = {"model": "rerank-v3.5", "query": QUERY, "documents": DOCS, "top_n": 2}
    async with client_for(app) as c:
        v2 = (await c.post("/v2/rerank", json=body)).json()
        v1 = await c.post("/v1/rerank", json={**body, "documents": [{"text": d} for d in DOCS]})
        inf = (await c.post("/rerank", json={**body, "return_documents": True})).json()
    logits = _expected(reranker, DOCS)
    order = sorted(range(3), key=lambda i: -logits[i])[:2]
    assert [x["index"] for x in v2["results"]] == order
    assert set(v2) == {"id", "results", "meta"}
    assert v2["results"][0]["relevance_score"] == pytest.approx(_sigmoid(logits[order[0]]), 1e-5)
    assert v1.status_code == 200
    v1_body = v1.json()
    assert v1_body["model"] == "ce"
    assert v1_body["results"][0]["document"] == {"text": DOCS[order[0]]}
    assert v1_body["usage"]["total_tokens"] > 0
    assert inf["object"] == "rerank"
    assert inf["results"][1]["document"] == DOCS[order[1]]
    assert inf["usage"]["prompt_tokens"] == v1_body["usage"]["total_tokens"]


async def test_predict_and_classify_name_labels(classifier: LoadedModel) -> None:
    app = build_app({"clf": classifier})
    async with client_for(app) as c:
        single = (await c.post("/predict", json={"inputs": "I love it"})).json()
        batch = (await c.post("/predict", json={"inputs": [["I love it"], ["a", "b"]]})).json()
        root = (await c.post("/", json={"inputs": "I love it", "parameters": {"top_k": 2}})).json()
        infinity = (await c.post("/classify", json={"input": ["I love it"]})).json()
    assert {p["label"] for p in single} == {"negative", "neutral", "positive"}
    assert sum(p["score"] for p in single) == pytest.approx(1.0, abs=1e-5)
    assert [p["score"] for p in single] == sorted((p["score"] for p in single), reverse=True)
    assert batch[0][0]["label"] == single[0]["label"]
    assert len(batch) == 2
    assert len(root) == 1
    assert len(root[0]) == 2
    assert root[0][0]["label"] == single[0]["label"]
    assert infinity["object"] == "classify"
    assert infinity["data"][0][0]["label"] == single[0]["label"]


async def test_a_route_of_another_kind_answers_400_naming_the_route(
    reranker: LoadedModel, classifier: LoadedModel
) -> None:
    app = build_app({"ce": reranker})
    async with client_for(app) as c:
        r = await c.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 400
        assert "reranker model" in r.json()["error"]["message"]
        assert "use POST /rerank" in r.json()["error"]["message"]
        r = await c.post("/embed", json={"inputs": "x"})
        assert r.status_code == 400
        assert r.json()["error_type"] == "backend"
        r = await c.post("/classify", json={"input": ["x"]})
        assert r.status_code == 400
        assert "use POST /rerank" in r.json()["error"]["message"]
    app = build_app({"clf": classifier})
    async with client_for(app) as c:
        r = await c.post("/v2/rerank", json={"model": "m", "query": "q", "documents": ["d"]})
        assert r.status_code == 400
        assert r.json() == {
            "message": "model 'clf' is a classifier model and does not answer "
            "POST /v2/rerank; use POST /predict"
        }


async def test_tei_errors_and_limits(reranker: LoadedModel) -> None:
    limits = RequestLimits(max_inputs=8)
    app = build_app({"ce": reranker}, limits=limits)
    async with client_for(app) as c:
        r = await c.post("/rerank", json={"query": "q", "texts": []})
        assert (r.status_code, r.json()["error_type"]) == (400, "empty")
        r = await c.post("/rerank", json={"query": "q", "texts": ["d"] * 9})
        assert (r.status_code, r.json()["error_type"]) == (413, "validation")
        assert "at most 8 items (--max-inputs), got 9" in r.json()["error"]
        r = await c.post("/rerank", json={"query": "q", "texts": "d"})
        assert (r.status_code, r.json()["error_type"]) == (422, "validation")
        long = "word " * 700
        r = await c.post("/rerank", json={"query": "q", "texts": ["d", long], "truncate": False})
        assert r.status_code == 413
        assert r.json()["error"].startswith("input 1 is 70")
        assert "over the model's window of 512" in r.json()["error"]
        r = await c.post("/rerank", json={"query": "q", "texts": ["d", long]})
        assert r.status_code == 200
        assert r.headers["x-truncated-inputs"] == "1"


async def test_a_thousand_passages_are_served_in_passes(reranker: LoadedModel) -> None:
    app = build_app(
        {"ce": reranker},
        batch={"ce": BatchConfig(max_batch_size=64, queue_size=1024)},
    )
    docs = [f"passage number {i} about cats" for i in range(1000)]
    async with client_for(app) as c:
        r = await c.post("/rerank", json={"query": QUERY, "texts": docs})
        assert r.status_code == 200, r.text
        assert len(r.json()) == 1000
        assert sorted(x["index"] for x in r.json()) == list(range(1000))
        sizes = [int(s) for s in r.headers["x-batch-size"].split(",")]
        assert max(sizes) <= 64
        assert len(set(r.headers["x-batch-id"].split(","))) >= 1000 // 64
        too_many = await c.post("/rerank", json={"query": QUERY, "texts": docs * 2})
        assert too_many.status_code == 413
    small = build_app({"ce": reranker}, batch={"ce": BatchConfig(queue_size=100)})
    async with client_for(small) as c:
        r = await c.post("/rerank", json={"query": QUERY, "texts": docs[:101]})
        assert r.status_code == 413
        assert "queues at most 100 (--queue-size)" in r.json()["error"]


async def test_a_full_queue_refuses_the_whole_rerank_with_retry_after(
    reranker: LoadedModel,
) -> None:
    import asyncio
    import threading

    gate = threading.Event()
    entered = threading.Event()
    fn = reranker.fn

    def held(items: Sequence[Any]) -> Any:
        entered.set()
        gate.wait(10)
        return fn(items)

    import dataclasses

    # A stated cost: no warm-up passes through the held model.
    model = dataclasses.replace(
        reranker, fn=held, initial_cost=CostEstimate(fixed_s=0.0, per_item_s=0.0)
    )
    app = build_app(
        {"ce": model},
        batch={"ce": BatchConfig(max_batch_size=4, queue_size=6, workers=1, prefetch=False)},
    )
    async with client_for(app) as c:
        first = asyncio.create_task(c.post("/rerank", json={"query": "q", "texts": ["a"] * 4}))
        await asyncio.to_thread(entered.wait, 10)
        second = asyncio.create_task(c.post("/rerank", json={"query": "q", "texts": ["b"] * 5}))
        batcher = app.registry.models["ce"].batcher
        assert batcher is not None
        for _ in range(1000):  # a bounded poll: the second request's five items queued
            if batcher.statistics().queue_depth == 5:
                break
            await asyncio.sleep(0.005)
        assert batcher.statistics().queue_depth == 5
        third = await c.post("/rerank", json={"query": "q", "texts": ["c"] * 3})
        assert third.status_code == 429
        assert third.headers["retry-after"]
        assert third.json()["error_type"] == "overloaded"
        gate.set()
        assert (await first).status_code == 200
        assert (await second).status_code == 200
        metrics = (await c.get("/metrics")).text
    # The refused request is counted once, as a request (not three items).
    assert 'reason="queue_full"' in metrics


async def test_embedders_answer_tei_embed_similarity_and_root() -> None:
    def fn(texts: list[str]) -> Any:
        out = np.array([[len(t), 1.0, 0.0, 2.0] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    app = build_app({"emb": embedding_model(fn, matryoshka=Matryoshka(dimensions=(2,)))})
    async with client_for(app) as c:
        r = await c.post("/embed", json={"inputs": "abc", "dimensions": 2})
        assert r.status_code == 200
        (vec,) = r.json()
        assert len(vec) == 2
        assert float(np.linalg.norm(vec)) == pytest.approx(1.0, abs=1e-6)
        r = await c.post("/embed", json={"inputs": ["a", "bb"], "dimensions": 5})
        assert r.status_code == 422
        r = await c.post("/", json={"inputs": ["a", "bb"]})
        assert len(r.json()) == 2
        r = await c.post("/", json={"inputs": {"source_sentence": "ab", "sentences": ["ab", "x"]}})
        assert r.json()[0] == pytest.approx(1.0, abs=1e-6)
        r = await c.post("/rerank", json={"query": "q", "texts": ["d"]})
        assert r.status_code == 400
        assert r.json()["error"].startswith("model 'emb' is an embedding model and does not")
        info = (await c.get("/info")).json()
        assert info["model_type"] == {"embedding": {"pooling": "mean"}}
        assert (await c.get("/health")).status_code == 200


async def test_tokenize_and_decode_as_tei(reranker: LoadedModel) -> None:
    app = build_app({"ce": reranker})
    async with client_for(app) as c:
        r = await c.post("/tokenize", json={"inputs": "Hello world"})
        assert r.status_code == 200, r.text
        (tokens,) = r.json()
        assert [t["text"] for t in tokens] == ["[CLS]", "hello", "world", "[SEP]"]
        assert tokens[0]["special"] is True
        assert tokens[0]["start"] is None
        assert (tokens[1]["start"], tokens[1]["stop"]) == (0, 5)
        batch = (await c.post("/tokenize", json={"inputs": ["a", "b c"]})).json()
        assert [len(row) for row in batch] == [3, 4]
        ids = [t["id"] for t in tokens]
        r = await c.post("/decode", json={"ids": ids})
        assert r.json() == ["hello world"]
        r = await c.post("/decode", json={"ids": [ids, ids[1:2]], "skip_special_tokens": False})
        assert r.json() == ["[CLS] hello world [SEP]", "hello"]
        r = await c.post("/decode", json={"ids": "x"})
        assert r.status_code == 422
        assert r.json()["error_type"] == "validation"


async def test_prompts_from_the_folder_are_prepended() -> None:
    seen: list[str] = []

    def fn(texts: Sequence[str]) -> Any:
        seen.extend(texts)
        return np.ones((len(texts), 4), dtype=np.float32) / 2

    prompts = Prompts(prompts={"query": "query: ", "passage": "passage: "}, default="passage")
    app = build_app({"emb": embedding_model(fn, prompts=prompts)})
    async with client_for(app) as c:
        assert (await c.post("/embed", json={"inputs": "a", "prompt_name": "query"})).is_success
        assert (await c.post("/embed", json={"inputs": "b"})).is_success
        assert (await c.post("/v1/embeddings", json={"input": "c"})).is_success
        r = await c.post("/embed", json={"inputs": "d", "prompt_name": "nope"})
        assert r.status_code == 422
        assert "defines passage, query" in r.json()["error"]
    assert seen == ["query: a", "passage: b", "passage: c"]


def test_folder_prompts_are_read_and_checked(tmp_path: Path) -> None:
    assert folder_prompts(tmp_path) == Prompts(prompts={})
    config = {"prompts": {"query": "q: "}, "default_prompt_name": "query"}
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(config))
    assert folder_prompts(tmp_path) == Prompts(prompts={"query": "q: "}, default="query")
    config["default_prompt_name"] = "other"
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="'other' is not one of its prompts"):
        folder_prompts(tmp_path)


async def test_kserve_v2_serves_rerankers_and_classifiers(
    reranker: LoadedModel, classifier: LoadedModel
) -> None:
    app = build_app({"ce": reranker, "clf": classifier})
    query = {"name": "query", "datatype": "BYTES", "shape": [1], "data": [QUERY]}
    passage = {"name": "passage", "datatype": "BYTES", "shape": [3], "data": DOCS}
    async with client_for(app) as c:
        meta = (await c.get("/v2/models/ce")).json()
        assert [i["name"] for i in meta["inputs"]] == ["query", "passage"]
        assert meta["outputs"] == [{"name": "score", "datatype": "FP32", "shape": [-1, 1]}]
        r = await c.post("/v2/models/ce/infer", json={"inputs": [query, passage]})
        assert r.status_code == 200, r.text
        (out,) = r.json()["outputs"]
        assert (out["name"], out["shape"]) == ("score", [3, 1])
        want = [_sigmoid(v) for v in _expected(reranker, DOCS)]
        assert out["data"] == pytest.approx(want, abs=1e-5)
        bad = await c.post("/v2/models/ce/infer", json={"inputs": [passage]})
        assert bad.status_code == 422
        assert "'query' and 'passage'" in bad.json()["error"]
        text = {"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": ["a", "b"]}
        r = await c.post("/v2/models/clf/infer", json={"inputs": [text]})
        (probs,) = r.json()["outputs"]
        assert (probs["name"], probs["shape"]) == ("probabilities", [2, 3])
        assert sum(probs["data"][:3]) == pytest.approx(1.0, abs=1e-5)
        meta = (await c.get("/v2/models/clf")).json()
        assert meta["outputs"][0]["shape"] == [-1, 3]


async def test_status_and_metrics_show_each_model_s_kind_and_item(
    reranker: LoadedModel, classifier: LoadedModel
) -> None:
    emb = embedding_model(lambda texts: [[1.0, 0.0]] * len(texts), dim=2)
    gen = LoadedModel(spec="g", fn=lambda items: list(items))
    app = build_app({"ce": reranker, "clf": classifier, "emb": emb, "gen": gen})
    async with client_for(app) as c:
        await c.post("/rerank", json={"model": "ce", "query": "q", "texts": ["a", "b", "c"]})
        # A classifier's pair is one item, as a text is.
        await c.post("/predict", json={"model": "clf", "inputs": [["a"], ["q", "p"]]})
        status = (await c.get("/status")).json()
        metrics = (await c.get("/metrics")).text
    models = status["models"]
    assert models["ce"]["kind"] == "reranker"
    assert models["clf"]["labels"] == ["negative", "neutral", "positive"]
    assert {n: (m["kind"], m["item"]) for n, m in models.items()} == {
        "ce": ("reranker", "pair"),
        "clf": ("classifier", "text"),
        "emb": ("embedding", "text"),
        "gen": ("generic", None),
    }
    # One rerank of three passages: three pairs in the passes.
    assert models["ce"]["batches"]["items"] == 3
    assert models["clf"]["batches"]["items"] == 2
    assert 'batchserve_model_info{item="pair",kind="reranker",model="ce"} 1.0' in metrics
    assert 'batchserve_model_info{item="text",kind="classifier",model="clf"} 1.0' in metrics
    assert 'batchserve_model_info{item="text",kind="embedding",model="emb"} 1.0' in metrics
    assert 'batchserve_model_info{item="item",kind="generic",model="gen"} 1.0' in metrics
    assert set(ITEMS) == {item_of(k) for k in BY_NAME.values()} - {None}
    assert item_of(None) is None  # a model still loading
