"""What the pipeline libraries send to a reranker or classifier, sent as they send it.

LangChain, LlamaIndex, Haystack and Infinity's generated client are too heavy for the dev
extra, so each test replays the exact request one of them makes (path, headers, body) over
raw HTTP to the app in-process, and checks the fields that client reads. Each names the
package, its version and the source line it mirrors; the versions are those installed and
driven against a real ``batchserve serve --model FOLDER`` when the tests were written.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from server_helpers import build_app, client_for, embedding_model

from batchserve.engines.loader import load_model
from batchserve.models.loader import LoadedModel
from batchserve.models.matryoshka import Matryoshka

pytest.importorskip("transformers")

QUERY = "what is a cat"
DOCS = [
    "A cat is a small domesticated carnivorous mammal.",
    "Paris is the capital of France.",
    "Cats sleep for most of the day.",
]
# What the Jina clients send besides the body (langchain-community's JinaRerank.session).
JINA_HEADERS = {
    "Authorization": "Bearer jina_unused",
    "Accept-Encoding": "identity",
    "Content-type": "application/json",
    "user-agent": "langchain",
}


def _sigmoids(reranker: LoadedModel, docs: list[str]) -> list[float]:
    logits = np.asarray(reranker.fn([(QUERY, d) for d in docs]))[:, 0]
    return [1.0 / (1.0 + math.exp(-float(v))) for v in logits]


def _order(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])


async def test_jina_clients_rerank_documents_with_no_text(reranker: LoadedModel) -> None:
    # langchain-community 0.4.2, document_compressors/jina_rerank.py, JinaRerank.rerank:
    #   data = {"query", "documents", "model", "top_n"}; self.session.post(JINA_API_URL, ...)
    # jina-haystack 1.2.0, rankers/jina/ranker.py, JinaRanker.run:
    #   "documents": [doc.content or "" for doc in documents], "top_n": top_k (may be None)
    # Both read results[].index and .relevance_score; Haystack also resp["model"], ["usage"].
    docs = [*DOCS, ""]
    expected = _sigmoids(reranker, docs)
    app = build_app({"ce": reranker})
    async with client_for(app) as c:
        r = await c.post(
            "/v1/rerank",
            headers=JINA_HEADERS,
            json={
                "query": QUERY,
                "documents": docs,
                "model": "jina-reranker-v1-base-en",
                "top_n": 3,
            },
        )
        haystack = await c.post(
            "/v1/rerank",
            json={
                "query": QUERY,
                "documents": docs,
                "model": "jina-reranker-v1-base-en",
                "top_n": None,
            },
        )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == _order(expected)[:3]
    for x in results:
        assert x["relevance_score"] == pytest.approx(expected[x["index"]], abs=1e-5)
    body = haystack.json()
    assert [x["index"] for x in body["results"]] == _order(expected)
    assert body["model"] == "ce"
    assert body["usage"]["total_tokens"] > 0


async def test_jina_clients_read_the_error_from_detail(reranker: LoadedModel) -> None:
    # The three Jina clients (langchain-community 0.4.2 JinaRerank, llama-index-postprocessor-
    # jinaai-rerank 0.6.0 JinaRerank._postprocess_nodes, jina-haystack 1.2.0 JinaRanker.run):
    #   if "results" not in resp: raise RuntimeError(resp["detail"])
    # LlamaIndex posts to f"{base_url}/rerank": /v1/rerank with Jina's base URL, /rerank
    # with a server's bare URL (Infinity's shape). Cohere's SDK reads "message".
    app = build_app({"ce": reranker})
    body = {"query": "", "documents": DOCS, "model": "jina-reranker-v1-base-en", "top_n": 2}
    async with client_for(app) as c:
        v1 = await c.post("/v1/rerank", headers=JINA_HEADERS, json=body)
        bare = await c.post("/rerank", headers=JINA_HEADERS, json=body)
    assert v1.status_code == 422
    assert "results" not in v1.json()
    assert v1.json()["detail"] == "query must not be an empty string"
    assert v1.json()["message"] == v1.json()["detail"]
    assert bare.status_code == 422
    assert "query must not be an empty string" in str(bare.json()["detail"])
    assert bare.json()["error_type"] == "validation"  # TEI's clients read error, error_type


async def test_llama_index_tei_rerank_scores_every_node(reranker: LoadedModel) -> None:
    # llama-index-postprocessor-tei-rerank 0.6.0, base.py, TextEmbeddingInference._call_api:
    #   json_data = {"query": query, "texts": texts}; client.post(f"{base_url}/rerank")
    # then `assert len(scores) == len(nodes)` and nodes[item["index"]].score = item["score"];
    # a node's text may be empty (an image node, a blank chunk).
    texts = [DOCS[0], "", DOCS[1]]
    expected = _sigmoids(reranker, texts)
    app = build_app({"ce": reranker})
    async with client_for(app) as c:
        r = await c.post(
            "/rerank",
            headers={"Content-Type": "application/json"},
            json={"query": QUERY, "texts": texts},
        )
    assert r.status_code == 200, r.text
    scores = r.json()
    assert len(scores) == len(texts)
    assert sorted(x["index"] for x in scores) == [0, 1, 2]
    for x in scores:
        assert float(x["score"]) == pytest.approx(expected[x["index"]], abs=1e-5)


async def test_cohere_v2_clients_send_empty_documents_and_a_token_cap(
    reranker: LoadedModel,
) -> None:
    # cohere-haystack 11.0.0, rankers/cohere/ranker.py, CohereRanker._prepare_cohere_input:
    #   meta_data_separator.join([*meta_values_to_embed, doc.content or ""]), then
    #   ClientV2.rerank(model, query, documents, max_tokens_per_doc=4096, top_n=top_k)
    # (cohere 5.21.1 v2/raw_client.py: POST v2/rerank {model, query, documents, top_n,
    # max_tokens_per_doc}); LangChain's CohereRerank and LlamaIndex's send the same body.
    docs = [DOCS[0], "", DOCS[2]]
    expected = _sigmoids(reranker, docs)
    app = build_app({"ce": reranker})
    body = {
        "model": "rerank-v3.5",
        "query": QUERY,
        "documents": docs,
        "top_n": 2,
        "max_tokens_per_doc": 4096,
    }
    async with client_for(app) as c:
        r = await c.post("/v2/rerank", json=body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == _order(expected)[:2]


async def test_cohere_v1_ranks_the_fields_of_object_documents(reranker: LoadedModel) -> None:
    # cohere 5.21.1, raw_base_client.py, RawBaseCohere.rerank: POST v1/rerank {model, query,
    # documents (strings or objects of strings), top_n, rank_fields, return_documents,
    # max_chunks_per_doc}. With rank_fields the named fields are ranked (as "key: value"
    # lines); without, an object's "text". The answer's document is the object as sent.
    docs = [{"title": "Cats", "text": DOCS[0]}, {"title": "France", "text": DOCS[1]}]
    ranked = [f"title: {d['title']}\ntext: {d['text']}" for d in docs]
    by_fields = _sigmoids(reranker, ranked)
    by_text = _sigmoids(reranker, [d["text"] for d in docs])
    app = build_app({"ce": reranker})
    body: dict[str, Any] = {"query": QUERY, "documents": docs, "return_documents": True}
    async with client_for(app) as c:
        fields = await c.post("/v1/rerank", json={**body, "rank_fields": ["title", "text"]})
        text = await c.post("/v1/rerank", json=body)
        no_text = await c.post("/v1/rerank", json={**body, "documents": [{"body": "x"}]})
        missing = await c.post(
            "/v1/rerank", json={**body, "documents": [{"body": "x"}], "rank_fields": ["title"]}
        )
        not_str = await c.post("/v1/rerank", json={**body, "documents": [{"text": 3}]})
    assert fields.status_code == 200, fields.text
    for x in fields.json()["results"]:
        assert x["relevance_score"] == pytest.approx(by_fields[x["index"]], abs=1e-5)
        assert x["document"] == docs[x["index"]]
    for x in text.json()["results"]:
        assert x["relevance_score"] == pytest.approx(by_text[x["index"]], abs=1e-5)
    assert no_text.status_code == 422
    assert (
        "documents[0] must be a string or an object with a 'text' field"
        in (no_text.json()["message"])
    )
    assert missing.status_code == 422
    assert "has none of the rank_fields ['title']" in missing.json()["message"]
    assert not_str.json()["message"] == "documents[0].text must be a string, got int"


async def test_infinity_client_reranks_classifies_and_parses_a_422(
    reranker: LoadedModel, classifier: LoadedModel
) -> None:
    # infinity_client 0.0.78, api/default/rerank.py and classify.py: POST /rerank with
    # RerankInput.to_dict() {query, documents, return_documents, raw_scores, model} and POST
    # /classify with {input, model, raw_scores}; ReRankResult.from_dict pops results[]
    # (relevance_score, index, document), model, usage (prompt_tokens, total_tokens);
    # a 422 is parsed as HTTPValidationError: detail = [{loc, msg, type}].
    expected = _sigmoids(reranker, DOCS)
    app = build_app({"ce": reranker, "clf": classifier})
    body = {
        "query": QUERY,
        "documents": DOCS,
        "return_documents": True,
        "raw_scores": False,
        "model": "ce",
    }
    async with client_for(app) as c:
        r = await c.post("/rerank", json=body)
        k = await c.post("/classify", json={"input": ["I love it"], "model": "clf"})
        bad = await c.post("/rerank", json={**body, "documents": [DOCS[0], 7]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [x["index"] for x in out["results"]] == _order(expected)
    assert out["results"][0]["document"] == DOCS[_order(expected)[0]]
    assert out["model"] == "ce"
    assert set(out["usage"]) >= {"prompt_tokens", "total_tokens"}
    assert k.status_code == 200, k.text
    assert {x["label"] for x in k.json()["data"][0]} == {"negative", "neutral", "positive"}
    assert set(k.json()["usage"]) >= {"prompt_tokens", "total_tokens"}
    assert bad.status_code == 422
    (detail,) = bad.json()["detail"]
    assert detail == {
        "loc": ["body", "documents[1]"],
        "msg": "documents[1] must be a string, got int",
        "type": "invalid",
    }


def _embed(texts: list[str]) -> list[list[float]]:
    return [[1.0, 0.0, 0.0, 0.0] for _ in texts]


async def test_one_server_for_a_pipeline_routes_each_client_to_its_model(
    reranker: LoadedModel, classifier: LoadedModel
) -> None:
    # A retrieval pipeline's server: `serve --model minilm --model ./ce --model ./clf`, the
    # embedder first (the default). TEI's clients name no model (llama-index-postprocessor-
    # tei-rerank 0.6.0 posts {"query", "texts"}); Cohere's and Jina's send their hosted
    # names (cohere v2: "rerank-v3.5"; langchain-community JinaRerank:
    # "jina-reranker-v1-base-en"); infinity_client sends none unless told.
    expected = _sigmoids(reranker, DOCS)
    app = build_app({"emb": embedding_model(_embed), "ce": reranker, "clf": classifier})
    async with client_for(app) as c:
        tei = await c.post("/rerank", json={"query": QUERY, "texts": DOCS})
        cohere = await c.post(
            "/v2/rerank", json={"model": "rerank-v3.5", "query": QUERY, "documents": DOCS}
        )
        jina = await c.post(
            "/v1/rerank",
            json={"model": "jina-reranker-v1-base-en", "query": QUERY, "documents": DOCS},
        )
        infinity = await c.post("/classify", json={"input": ["I love it"]})
        embed = await c.post("/embed", json={"inputs": "a"})
        # /predict answers a classifier or a reranker: the classifier first, as
        # InferenceClient(model=URL/predict).text_classification names no model.
        unnamed = await c.post("/predict", json={"inputs": "I love it"})
        named = await c.post("/predict", json={"inputs": "I love it", "model": "ce"})
        # A hosted name that is not served: the one model of the route's first kind answers,
        # as the Cohere and Jina clients' names reach the one reranker.
        hosted = await c.post("/predict", json={"inputs": "I love it", "model": "nope"})
    assert tei.status_code == 200, tei.text
    assert [x["index"] for x in tei.json()] == _order(expected)
    assert [x["index"] for x in cohere.json()["results"]] == _order(expected)
    assert jina.json()["model"] == "ce"
    assert infinity.json()["model"] == "clf"
    assert embed.json() == [[1.0, 0.0, 0.0, 0.0]]
    assert {p["label"] for p in unnamed.json()} == {"negative", "neutral", "positive"}
    assert [p["label"] for p in named.json()] == ["LABEL_0"]  # the reranker, named
    assert hosted.json() == unnamed.json()


async def test_inference_client_s_other_tasks_are_refused_not_misread(
    classifier: LoadedModel,
) -> None:
    # huggingface_hub 2.4.0, inference/_client.py, InferenceClient.zero_shot_classification
    # posts to the model's URL, as text_classification does, with
    # {"inputs": text, "parameters": {"candidate_labels", "multi_label", ...}} (None values
    # dropped by filter_none). A classifier answering it as text classification would lose
    # the candidate labels: it is refused, naming them.
    app = build_app({"clf": classifier})
    async with client_for(app) as c:
        zero = await c.post(
            "/",
            json={
                "inputs": "I love it",
                "parameters": {"candidate_labels": ["a", "b"], "multi_label": False},
            },
        )
        text = await c.post("/", json={"inputs": "I love it", "parameters": {"top_k": 1}})
    assert zero.status_code == 422
    assert zero.json()["error"].startswith(
        "parameters.candidate_labels is not a parameter of text classification"
    )
    assert len(text.json()[0]) == 1


async def test_haystack_tei_embedder_embeds_a_document_with_no_text() -> None:
    # huggingface-api-haystack 3.1.0, embedders/huggingface_api/document_embedder.py:
    #   embedding_separator.join([*meta_values_to_embed, doc.content or ""]), then
    #   InferenceClient.feature_extraction(text=batch, truncate=True, normalize=False)
    # which posts {"inputs": [...], "truncate": true, "normalize": false} to the URL
    # (huggingface_hub 2.4.0, HFInferenceFeatureExtractionTask: parameters at the root).
    seen: list[str] = []

    def embed(texts: list[str]) -> list[list[float]]:
        seen.extend(texts)
        return [[float(len(t)), 1.0, 0.0, 0.0] for t in texts]

    app = build_app({"emb": embedding_model(embed)})
    body = {"inputs": ["a cat", ""], "truncate": True, "normalize": False}
    async with client_for(app) as c:
        root = await c.post("/", json=body)
        embed_route = await c.post("/embed", json={"inputs": ""})
        openai = await c.post("/v1/embeddings", json={"input": ""})
    assert root.status_code == 200, root.text
    assert len(root.json()) == 2
    assert sorted(seen[:2]) == ["", "a cat"]
    assert embed_route.status_code == 200
    assert openai.status_code == 422  # OpenAI's API refuses an empty string; so does this


@pytest.fixture(scope="module")
def minilm() -> LoadedModel:
    pytest.importorskip("sentence_transformers")
    return load_model("minilm:backend=torch,threads=1")


def _cosine(a: Any, b: Any) -> float:
    u, v = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))


async def test_an_empty_text_is_embedded_as_its_special_tokens(minilm: LoadedModel) -> None:
    # TEI embeds "" as the model's [CLS] [SEP] (what huggingface-api-haystack 3.1.0's
    # document embedder sends for a document without content, as above); Infinity too, and
    # it counts the two tokens in its usage.
    fn: Any = minilm.fn
    encoder = fn.library  # the torch engine's own SentenceTransformer
    alone = encoder.encode([""])[0]
    assert minilm.count_tokens is not None
    assert minilm.count_tokens([""]) == [2]
    texts = ["A cat sat on the mat, and then it slept for most of the day.", ""]
    app = build_app({"emb": minilm})
    async with client_for(app) as c:
        root = await c.post("/", json={"inputs": texts, "truncate": True, "normalize": False})
        infinity = await c.post("/embeddings", json={"input": texts, "model": "x"})
    assert root.status_code == 200, root.text
    vector = np.asarray(root.json()[1])
    assert np.isfinite(vector).all()
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)
    # batched with a longer text (padded), it is still what encode("") gives alone
    assert _cosine(vector, alone) >= 0.9999
    assert infinity.status_code == 200, infinity.text
    assert _cosine(infinity.json()["data"][1]["embedding"], alone) >= 0.9999
    assert infinity.json()["usage"]["prompt_tokens"] == sum(minilm.count_tokens(texts))


async def test_infinity_client_lists_models_embeds_and_checks_health(
    reranker: LoadedModel, classifier: LoadedModel
) -> None:
    # infinity_client 0.0.78 (generated from Infinity's OpenAPI document):
    # - api/default/models.py: GET /models; OpenAIModelInfo.from_dict -> ModelInfo.from_dict
    #   pops id, stats (any dict), object (ModelInfoObject: "model"), owned_by
    #   (ModelInfoOwnedBy: "infinity" or absent, anything else a ValueError), created,
    #   backend, capabilities;
    # - api/default/embeddings.py: POST /embeddings with OpenAIEmbeddingInputText.to_dict():
    #   {"input", "model": "default/not-specified", "dimensions": 0, "modality": "text"};
    #   OpenAIEmbeddingResult.from_dict pops data[] (object, embedding, index), model,
    #   usage, object, id, created; a 422 is HTTPValidationError: detail = [{loc, msg, type}];
    # - api/default/health.py: GET /health; ResponseHealth.from_dict(response.json()).
    # langchain-community 0.4.2, embeddings/infinity.py, TinyAsyncOpenAIInfinityEmbeddingClient
    # posts {"input": texts, "model": model} to f"{host}/embeddings" and reads data[].embedding.
    app = build_app(
        {
            "emb": embedding_model(_embed, matryoshka=Matryoshka(dimensions=(2,))),
            "ce": reranker,
            "clf": classifier,
        }
    )
    client_body = {"model": "default/not-specified", "dimensions": 0, "modality": "text"}
    async with client_for(app) as c:
        models = await c.get("/models")
        embedded = await c.post("/embeddings", json={**client_body, "input": ["a cat", ""]})
        langchain = await c.post("/embeddings", json={"input": ["a cat"], "model": "emb"})
        cut = await c.post("/embeddings", json={"input": "a cat", "dimensions": 2})
        image = await c.post(
            "/embeddings", json={**client_body, "input": ["x"], "modality": "image"}
        )
        reranker_asked = await c.post("/embeddings", json={"input": "a cat", "model": "ce"})
        health = await c.get("/health")
    assert models.status_code == 200, models.text
    listed = models.json()["data"]
    assert [m["id"] for m in listed] == ["emb", "ce", "clf"]
    assert [m["capabilities"] for m in listed] == [["embed"], ["rerank"], ["classify"]]
    for m in listed:
        assert m["object"] == "model"
        assert "owned_by" not in m
        assert set(m["stats"]) == {
            "queue_fraction",
            "queue_absolute",
            "results_pending",
            "batch_size",
        }
    assert embedded.status_code == 200, embedded.text
    out = embedded.json()
    assert [(d["object"], d["index"]) for d in out["data"]] == [("embedding", 0), ("embedding", 1)]
    assert out["data"][0]["embedding"] == [1.0, 0.0, 0.0, 0.0]
    assert out["model"] == "emb"
    assert set(out["usage"]) == {"prompt_tokens", "total_tokens"}
    assert out["id"].startswith("infinity-")
    assert isinstance(out["created"], int)
    assert langchain.json()["data"][0]["embedding"] == [1.0, 0.0, 0.0, 0.0]
    assert cut.json()["data"][0]["embedding"] == [1.0, 0.0]
    assert image.status_code == 422
    assert image.json()["detail"] == [
        {
            "loc": ["body", "modality"],
            "msg": "modality must be 'text' (this server embeds texts), got 'image'",
            "type": "invalid",
        }
    ]
    assert image.json()["error"]["code"] == 422
    assert reranker_asked.status_code == 400
    assert reranker_asked.json()["error"]["message"] == (
        "model 'ce' is a reranker model and does not answer POST /embeddings; use POST /rerank"
    )
    assert health.status_code == 200
    assert isinstance(health.json()["unix"], float)
