"""POST /v1/embeddings and GET /v1/models, in-process: shapes, encodings, checks, headers."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import numpy as np
import pytest
from batchserve_testmodels import Recorder, vector
from server_helpers import build_app, client_for, embedding_model

from batchserve.config import BatchConfig
from batchserve.models.loader import LoadedModel
from batchserve.models.matryoshka import Matryoshka
from batchserve.server import RequestLimits


async def test_one_text_and_a_list_answer_in_order_with_usage() -> None:
    app = build_app({"rec": embedding_model(Recorder())})
    async with client_for(app) as c:
        r = await c.post("/v1/embeddings", json={"input": "hello there", "model": "rec"})
        assert r.status_code == 200
        body = r.json()
        assert body["object"] == "list"
        assert body["model"] == "rec"
        assert body["data"][0]["index"] == 0
        assert body["data"][0]["embedding"] == pytest.approx(vector("hello there"))
        # No count_tokens: words are counted.
        assert body["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
        texts = ["a", "bb bb", "ccc"]
        r = await c.post("/v1/embeddings", json={"input": texts})
        assert [d["index"] for d in r.json()["data"]] == [0, 1, 2]
        for d, t in zip(r.json()["data"], texts, strict=True):
            assert d["embedding"] == pytest.approx(vector(t))
        assert r.json()["usage"]["prompt_tokens"] == 4


async def test_base64_is_little_endian_float32_of_the_same_vector() -> None:
    app = build_app({"rec": embedding_model(Recorder())})
    async with client_for(app) as c:
        r = await c.post("/v1/embeddings", json={"input": ["x", "y"], "encoding_format": "base64"})
        assert r.status_code == 200
        for d, t in zip(r.json()["data"], ["x", "y"], strict=True):
            got = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
            assert got == pytest.approx(np.asarray(vector(t), dtype=np.float32))


async def test_token_usage_comes_from_the_model_when_it_counts() -> None:
    model = embedding_model(Recorder(), count_tokens=lambda ts: [10 * len(t) for t in ts])
    async with client_for(build_app({"rec": model})) as c:
        r = await c.post("/v1/embeddings", json={"input": ["ab", "c"]})
        assert r.json()["usage"] == {"prompt_tokens": 30, "total_tokens": 30}


async def test_timing_headers_have_one_value_per_input() -> None:
    app = build_app({"rec": embedding_model(Recorder())})
    async with client_for(app) as c:
        r = await c.post("/v1/embeddings", json={"input": ["a", "b", "c"]})
        for h in ("x-queue-wait-s", "x-batch-size", "x-batch-id", "x-forward-s"):
            values = r.headers[h].split(",")
            assert len(values) == 3, h
            assert all(float(v) >= 0 for v in values)


async def test_a_request_split_across_batches_is_answered_in_order() -> None:
    rec = Recorder()
    app = build_app({"rec": embedding_model(rec)}, batch={"rec": BatchConfig(max_batch_size=2)})
    texts = [f"text number {i}" for i in range(5)]
    async with client_for(app) as c:
        r = await c.post("/v1/embeddings", json={"input": texts})
    assert r.status_code == 200
    for d, t in zip(r.json()["data"], texts, strict=True):
        assert d["embedding"] == pytest.approx(vector(t))
    batch_ids = r.headers["x-batch-id"].split(",")
    assert len(set(batch_ids)) == 3  # 2 + 2 + 1
    assert [int(s) for s in r.headers["x-batch-size"].split(",")] == [2, 2, 2, 2, 1]
    assert max(len(b) for b in rec.batches) == 2


def _unit(texts: Sequence[str]) -> list[list[float]]:
    out = np.asarray([vector(t) for t in texts])
    return list(out / np.linalg.norm(out, axis=1, keepdims=True))


#: Models that declare they were trained at 2 dimensions (Matryoshka), as a folder's
#: ``matryoshka_dimensions`` says: 2 is accepted without --any-dimensions.
_TRAINED_AT_2 = Matryoshka(dimensions=(2,))


async def test_dimensions_shortens_renormalising_unit_vectors_and_refuses_above_the_model() -> None:
    app = build_app(
        {
            "rec": embedding_model(Recorder(), dim=4, normalized=False, matryoshka=_TRAINED_AT_2),
            "unit": embedding_model(_unit, dim=4, normalized=True, matryoshka=_TRAINED_AT_2),
            "unknown": embedding_model(_unit, dim=4, matryoshka=_TRAINED_AT_2),
        }
    )
    async with client_for(app) as c:
        ok = await c.post("/v1/embeddings", json={"input": "ab", "dimensions": 4})
        assert ok.status_code == 200
        assert ok.json()["data"][0]["embedding"] == pytest.approx(vector("ab"))
        # JSON's 2.0 is the integer 2, as JSON Schema (and the spec's "integer") reads it
        short = await c.post("/v1/embeddings", json={"input": ["ab", "bc"], "dimensions": 2.0})
        assert short.status_code == 200
        # A model whose vectors are not unit length gets its own values, cut.
        for text, item in zip(["ab", "bc"], short.json()["data"], strict=True):
            assert item["embedding"] == pytest.approx(vector(text)[:2], abs=1e-6)
        # A unit-length model's cut vectors are scaled back to unit length, and so are those
        # of a model that does not say.
        for name in ("unit", "unknown"):
            body = {"model": name, "input": ["ab", "bc"], "dimensions": 2}
            short = await c.post("/v1/embeddings", json=body)
            for text, item in zip(["ab", "bc"], short.json()["data"], strict=True):
                cut = np.asarray(vector(text)[:2])
                unit = list(cut / np.linalg.norm(cut))
                assert item["embedding"] == pytest.approx(unit, abs=1e-6), name
        r = await c.post("/v1/embeddings", json={"input": "a", "dimensions": 5})
        assert r.status_code == 422
        err = r.json()["error"]
        assert err["param"] == "dimensions"
        assert "4-dimensional" in err["message"]
        assert r.headers["x-reason"] == "invalid"


@pytest.mark.parametrize(
    ("body", "status", "reason", "param", "words"),
    [
        (b"{not json", 400, "malformed", "body", "valid JSON"),
        (b"[1, 2]", 422, "invalid", "body", "JSON object"),
        (b'{"model": "rec"}', 422, "invalid", "input", "required"),
        (b'{"input": 42}', 422, "invalid", "input", "string or a list"),
        (b'{"input": []}', 422, "invalid", "input", "empty list"),
        (b'{"input": ""}', 422, "invalid", "input", "empty string"),
        (b'{"input": ["a", 7]}', 422, "invalid", "input[1]", "must be a string"),
        (b'{"input": [[1, 2]]}', 422, "invalid", "input[0]", "token arrays"),
        (b'{"input": "a", "encoding_format": "int8"}', 422, "invalid", "encoding_format", "base64"),
        (b'{"input": "a", "dimensions": 0}', 422, "invalid", "dimensions", ">= 1"),
        (b'{"input": "a", "dimensions": 1.5}', 422, "invalid", "dimensions", ">= 1"),
        (b'{"input": "a", "model": 3}', 422, "invalid", "model", "string"),
        (b'{"input": ["a", "b", "c", "d"]}', 413, "too_large", "input", "at most 3 items"),
        # Over --max-input-chars: cut when truncating (the default), refused when the whole
        # text is asked for (split into windows).
        (
            b'{"input": "' + b"x" * 11 + b'", "long_inputs": {"split": true}}',
            413,
            "too_large",
            "input",
            "at most 10 characters",
        ),
        (b'{"input": "a", "model": "nope"}', 404, "not_found", "model", "served: rec"),
    ],
)
async def test_bad_requests_name_the_field_and_the_rule(
    body: bytes, status: int, reason: str, param: str, words: str
) -> None:
    rec = Recorder()
    limits = RequestLimits(max_inputs=3, max_input_chars=10)
    app = build_app({"rec": embedding_model(rec)}, limits=limits)
    async with client_for(app) as c:
        r = await c.post(
            "/v1/embeddings", content=body, headers={"content-type": "application/json"}
        )
    assert r.status_code == status, r.text
    assert r.headers["x-reason"] == reason
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == reason
    assert err["param"] == param
    assert words in err["message"]
    assert rec.seen == []


async def test_body_over_the_limit_is_413_before_reading_it() -> None:
    app = build_app({"rec": embedding_model(Recorder())}, limits=RequestLimits(max_body_bytes=100))
    async with client_for(app) as c:
        r = await c.post("/v1/embeddings", json={"input": "x" * 200})
    assert r.status_code == 413
    assert r.headers["x-reason"] == "too_large"
    assert "at most 100 bytes" in r.json()["error"]["message"]


async def test_a_generic_model_is_refused_on_the_embeddings_endpoint() -> None:
    generic = LoadedModel(spec="g", fn=lambda xs: list(xs))
    async with client_for(build_app({"g": generic})) as c:
        r = await c.post("/v1/embeddings", json={"input": "a"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "wrong_kind"
    assert "a generic model" in r.json()["error"]["message"]
    assert "/v2/models/g/infer" in r.json()["error"]["message"]


async def test_a_body_error_is_counted_against_the_model_the_body_named() -> None:
    # The endpoint returns what it parsed and never sets the exchange's model: an error found
    # once the body has named its model is still counted against that model; one found
    # before it is counted against none.
    generic = LoadedModel(spec="g", fn=lambda xs: list(xs))
    app = build_app({"g": generic, "rec": embedding_model(Recorder())})
    async with client_for(app) as c:
        r = await c.post("/v1/embeddings", json={"input": "a", "model": "g"})
        assert r.status_code == 400
        r = await c.post(
            "/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400
        text = (await c.get("/metrics")).text
    counted = [line for line in text.splitlines() if line.startswith("batchserve_requests_total")]
    assert (
        'batchserve_requests_total{model="g",outcome="invalid",reason="wrong_kind"} 1.0' in counted
    )
    assert any('model="_unknown"' in line and 'reason="malformed"' in line for line in counted)


async def test_models_list_and_one_model() -> None:
    app = build_app({"a": embedding_model(Recorder()), "b": embedding_model(Recorder())})
    async with client_for(app) as c:
        r = await c.get("/v1/models")
        assert [m["id"] for m in r.json()["data"]] == ["a", "b"]
        assert (await c.get("/v1/models/b")).json()["id"] == "b"
        missing = await c.get("/v1/models/zzz")
        assert missing.status_code == 404
        assert missing.headers["x-reason"] == "not_found"


async def test_unknown_route_and_wrong_method() -> None:
    async with client_for(build_app({"rec": embedding_model(Recorder())})) as c:
        r = await c.get("/v1/embeddings")
        assert r.status_code == 405
        assert r.headers["x-reason"] == "method_not_allowed"
        r = await c.get("/nowhere")
        assert r.status_code == 404
        assert json.loads(r.content)["error"]["code"] == "not_found"


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_the_body_is_the_compact_json_of_the_documented_object(fmt: str) -> None:
    import orjson

    from batchserve.server.protocols.openai import embeddings_response

    vectors = [np.array([0.1, -2.5, 3e-8], dtype=np.float32), [1.0, 0.30000001192092896, 7.0]]
    body = embeddings_response("m\u00e9", vectors, fmt, 5)
    data = []
    for i, v in enumerate(vectors):
        arr = np.asarray(v, dtype=np.float32)
        emb = base64.b64encode(arr.tobytes()).decode() if fmt == "base64" else arr.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    expected = {
        "object": "list",
        "data": data,
        "model": "m\u00e9",
        "usage": {"prompt_tokens": 5, "total_tokens": 5},
    }
    assert body == orjson.dumps(expected)  # byte for byte what clients always got
