"""Which model answers a task route whose body names none, on a server of several.

``/predict`` is answered by a classifier or a reranker: the classifier first, so
``huggingface_hub``'s ``InferenceClient(model=URL/predict).text_classification(...)``, which
names no model, reaches the one classifier of a server that also serves a reranker; the
reranker answers only where no classifier is served. Truly ambiguous bodies are refused,
naming the models.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import ServerProcess, build_app, client_for, embedding_model, server_process

from batchserve.models.kinds import BY_NAME, MULTIVECTOR
from batchserve.models.loader import LoadedModel
from batchserve.server.protocols import rerankers, tei

pytest.importorskip("transformers")

CLASSES = {"negative", "neutral", "positive"}


def _embed(texts: list[str]) -> list[list[float]]:
    return [[1.0, 0.0] for _ in texts]


def _labels(answer: Any) -> set[str]:
    return {p["label"] for p in answer}


async def test_predict_goes_to_the_classifier_whichever_model_is_the_default(
    reranker: LoadedModel, classifier: LoadedModel
) -> None:
    # The reranker first, so the default: a body that names no model still classifies.
    app = build_app({"ce": reranker, "clf": classifier, "emb": embedding_model(_embed, dim=2)})
    async with client_for(app) as c:
        single = await c.post("/predict", json={"inputs": "I love it"})
        batch = await c.post("/predict", json={"inputs": [["I love it"], ["a", "b"]]})
        rerank = await c.post("/rerank", json={"query": "q", "texts": ["a", "b"]})
    assert single.status_code == 200, single.text
    assert _labels(single.json()) == CLASSES
    assert [_labels(a) for a in batch.json()] == [CLASSES, CLASSES]
    assert len(rerank.json()) == 2  # the reranker still answers its own routes


async def test_a_reranker_answers_predict_where_no_classifier_is_served(
    reranker: LoadedModel,
) -> None:
    app = build_app({"emb": embedding_model(_embed, dim=2), "ce": reranker})
    async with client_for(app) as c:
        r = await c.post("/predict", json={"inputs": ["what is a cat", "a small mammal"]})
    assert r.status_code == 200, r.text
    assert _labels(r.json()) == {"LABEL_0"}


async def test_truly_ambiguous_bodies_name_the_models(
    reranker: LoadedModel, classifier: LoadedModel
) -> None:
    # The default (the first) answers a route of its kind; an embedder answers none of these.
    emb = embedding_model(_embed, dim=2)
    app = build_app(
        {"emb": emb, "ce": reranker, "ce2": reranker, "clf": classifier, "clf2": classifier}
    )
    async with client_for(app) as c:
        predict = await c.post("/predict", json={"inputs": "I love it"})
        rerank = await c.post("/rerank", json={"query": "q", "texts": ["a"]})
        classify = await c.post("/classify", json={"input": ["I love it"]})
        named = await c.post("/predict", json={"inputs": "I love it", "model": "clf2"})
        unknown = await c.post("/predict", json={"inputs": "I love it", "model": "nope"})
    assert (predict.status_code, predict.json()["error"]) == (
        422,
        "several models answer this route (clf, clf2); name one in the body's model",
    )
    assert rerank.status_code == 422
    assert "several models answer this route (ce, ce2)" in rerank.json()["error"]
    assert "several models answer this route (clf, clf2)" in classify.json()["error"]["message"]
    assert _labels(named.json()) == CLASSES
    assert unknown.status_code == 404
    assert "served: emb, ce, ce2, clf, clf2" in unknown.json()["error"]


def test_every_task_s_kinds_list_its_route() -> None:
    # A task names the kinds it answers; each of those kinds names the task's route among
    # its own (what a wrong-kind error points to), so the two cannot drift apart.
    tasks = [
        tei.EMBED,
        tei.RERANK,
        tei.PREDICT,
        tei.SIMILARITY,
        rerankers.COHERE_V1_RERANK,
        rerankers.COHERE_V2_RERANK,
        rerankers.INFINITY_RERANK,
        rerankers.CLASSIFY,
        # A multi-vector model's: its own route, and MaxSim on the rerank routes.
        tei.EMBED_ALL,
        tei.MAXSIM_RERANK,
        rerankers.choose_cohere_v1({}, MULTIVECTOR),
        rerankers.choose_cohere_v2({}, MULTIVECTOR),
        rerankers.choose_rerank({"documents": []}, MULTIVECTOR),
    ]
    for task in tasks:
        assert task.kinds, task.route
        for kind in task.kinds:
            assert task.route in kind.routes, (task.route, kind.name)
    answering = {
        route: [k.name for k in BY_NAME.values() if route in k.routes]
        for route in {t.route for t in tasks}
    }
    served: dict[str, set[str]] = {}
    for t in tasks:
        served.setdefault(t.route, set()).update(k.name for k in t.kinds)
    assert served == {r: set(names) for r, names in answering.items()}


@pytest.fixture(scope="module")
def two_model_server(reranker_folder: Path, classifier_folder: Path) -> Iterator[ServerProcess]:
    args = ["--model", str(reranker_folder), "--model", str(classifier_folder)]
    with server_process([*args, "--backend", "torch", "--max-wait", "2ms"]) as server:
        yield server


@pytest.mark.slow
def test_inference_client_classifies_at_predict_beside_a_reranker(
    two_model_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # huggingface_hub 2.4.0: InferenceClient(model=URL).text_classification(text) posts
    # {"inputs": text, "parameters": {...}} to URL, naming no model, and reads the first
    # element of the answer: TEI's /predict answers one text with its labels by score, so
    # the client gets the top one.
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub.constants, "is_offline_mode", lambda: False)
    client = hub.InferenceClient(model=f"{two_model_server.url}/predict")
    top = client.text_classification("I love it")
    ranked = httpx.post(f"{two_model_server.url}/predict", json={"inputs": "I love it"}).json()
    assert {p["label"] for p in ranked} == CLASSES
    assert (top.label, top.score) == (ranked[0]["label"], pytest.approx(ranked[0]["score"]))
