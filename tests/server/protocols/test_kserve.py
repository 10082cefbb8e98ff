"""KServe v2 in-process: metadata, health, infer in JSON and binary, generic tensors."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from batchserve_testmodels import Recorder, double, upper, vector
from server_helpers import build_app, client_for, embedding_model

from batchserve.models.loader import LoadedModel
from batchserve.server.protocols.tensors import pack_bytes, unpack_bytes
from batchserve.server.statuses import ApiError

tritonhttp = pytest.importorskip("tritonclient.http")
from tritonclient.http._utils import _get_inference_request  # noqa: E402


def triton_body(
    inputs: list[Any], outputs: list[Any] | None = None, timeout: int | None = None
) -> tuple[bytes, dict[str, str]]:
    """Encode a request exactly as tritonclient.http does."""
    body, json_size = _get_inference_request(
        inputs=inputs,
        request_id="r1",
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=timeout,
        custom_parameters=None,
    )
    headers = {} if json_size is None else {"Inference-Header-Content-Length": str(json_size)}
    return body, headers


def triton_result(r: Any) -> Any:
    length = r.headers.get("inference-header-content-length")
    return tritonhttp.InferResult.from_response_body(
        r.content, header_length=int(length) if length else None
    )


async def test_server_and_model_metadata_and_health() -> None:
    app = build_app({"rec": embedding_model(Recorder(), dim=4)})
    async with client_for(app) as c:
        meta = (await c.get("/v2")).json()
        assert meta["name"] == "batchserve"
        assert "binary_tensor_data" in meta["extensions"]
        assert (await c.get("/v2/health/live")).status_code == 200
        assert (await c.get("/v2/health/ready")).status_code == 200
        m = (await c.get("/v2/models/rec")).json()
        assert m["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
        assert m["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 4]}]
        assert (await c.get("/v2/models/rec/ready")).status_code == 200
        assert (await c.get("/v2/models/rec/versions/1/ready")).status_code == 200
        # inference names a version as the other routes do (and as gRPC's ModelInfer)
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}
        assert (await c.post("/v2/models/rec/versions/1/infer", json=body)).status_code == 200
        wrong = await c.post("/v2/models/rec/versions/2/infer", json=body)
        assert wrong.status_code == 404
        assert "served versions: 1" in wrong.json()["error"]
        missing = await c.get("/v2/models/nope")
        assert missing.status_code == 404
        assert "nope" in missing.json()["error"]


@pytest.mark.parametrize("binary", [True, False])
async def test_infer_texts_as_tritonclient_encodes_them(binary: bool) -> None:
    app = build_app({"rec": embedding_model(Recorder())})
    texts = ["first text", "second", "ünïcode ✓"]
    inp = tritonhttp.InferInput("text", [3], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary)
    out = tritonhttp.InferRequestedOutput("embedding", binary_data=binary)
    body, headers = triton_body([inp], [out])
    async with client_for(app) as c:
        r = await c.post("/v2/models/rec/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert ("inference-header-content-length" in r.headers) is binary
    result = triton_result(r)
    got = result.as_numpy("embedding")
    assert got.dtype == np.float32
    assert got.shape == (3, 4)
    for row, t in zip(got, texts, strict=True):
        assert row == pytest.approx(vector(t))
    assert result.get_response()["id"] == "r1"
    assert len(r.headers["x-batch-id"].split(",")) == 3


async def test_no_outputs_listed_answers_binary_as_triton_asks() -> None:
    app = build_app({"rec": embedding_model(Recorder())})
    inp = tritonhttp.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"hi"]], dtype=object))
    body, headers = triton_body([inp])
    async with client_for(app) as c:
        r = await c.post("/v2/models/rec/infer", content=body, headers=headers)
    assert r.status_code == 200
    assert "inference-header-content-length" in r.headers
    assert triton_result(r).as_numpy("embedding")[0] == pytest.approx(vector("hi"))


async def test_generic_model_takes_numeric_tensors_row_by_row() -> None:
    app = build_app({"double": LoadedModel(spec="d", fn=double)})
    x = np.arange(6, dtype=np.int64).reshape(3, 2)
    inp = tritonhttp.InferInput("x", [3, 2], "INT64")
    inp.set_data_from_numpy(x)
    body, headers = triton_body([inp], [tritonhttp.InferRequestedOutput("output")])
    async with client_for(app) as c:
        r = await c.post("/v2/models/double/infer", content=body, headers=headers)
        assert r.status_code == 200, r.text
        got = triton_result(r).as_numpy("output")
        assert got.dtype == np.int64
        assert (got == x * 2).all()
        jr = await c.post(
            "/v2/models/double/infer",
            json={"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.5, 2]}]},
        )
        assert jr.json()["outputs"] == [
            {"name": "output", "datatype": "FP32", "shape": [2], "data": [3.0, 4.0]}
        ]


async def test_generic_model_takes_bytes_rows() -> None:
    app = build_app({"upper": LoadedModel(spec="u", fn=upper)})
    async with client_for(app) as c:
        r = await c.post(
            "/v2/models/upper/infer",
            json={"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]},
        )
    assert r.json()["outputs"][0]["data"] == ["A", "B"]


async def test_parameters_timeout_is_microseconds() -> None:
    app = build_app({"rec": embedding_model(Recorder())})
    body = {
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}],
        "parameters": {"timeout": 0},
    }
    async with client_for(app) as c:
        r = await c.post("/v2/models/rec/infer", json=body)
        assert r.status_code == 422
        assert "microseconds" in r.json()["error"]
        body["parameters"] = {"timeout": 5_000_000}
        assert (await c.post("/v2/models/rec/infer", json=body)).status_code == 200


@pytest.mark.parametrize(
    ("request_body", "reason", "words"),
    [
        ({"inputs": []}, "invalid", "non-empty list"),
        (
            {"inputs": [{"name": "t", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
            "invalid",
            "BYTES",
        ),
        (
            {"inputs": [{"name": "t", "shape": [2], "datatype": "BYTES", "data": ["a"]}]},
            "invalid",
            "holds 2",
        ),
        (
            {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": [""]}]},
            "invalid",
            "empty",
        ),
        (
            {"inputs": [{"name": "t", "shape": [1], "datatype": "NOPE", "data": [1]}]},
            "invalid",
            "datatype",
        ),
        # Found by the fuzzer (tests/server/protocols/fuzz_kserve.py): a datatype that is a list
        # was looked up as a key and raised TypeError, answered 500.
        (
            {"inputs": [{"name": "t", "shape": [1], "datatype": [1, 2], "data": [1]}]},
            "invalid",
            "datatype",
        ),
        (
            {
                "inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
                "outputs": [{"name": "logits"}],
            },
            "invalid",
            "logits",
        ),
    ],
)
async def test_bad_infer_requests(request_body: dict[str, Any], reason: str, words: str) -> None:
    rec = Recorder()
    async with client_for(build_app({"rec": embedding_model(rec)})) as c:
        r = await c.post("/v2/models/rec/infer", json=request_body)
    assert r.status_code == 422, r.text
    assert r.headers["x-reason"] == reason
    assert words in r.json()["error"]
    assert rec.seen == []


async def test_malformed_binary_bodies_are_400() -> None:
    async with client_for(build_app({"rec": embedding_model(Recorder())})) as c:
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "t",
                        "shape": [1],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": 9},
                    }
                ]
            }
        ).encode()
        for extra, headers in [
            (b"\x05\x00\x00\x00ab", {"Inference-Header-Content-Length": str(len(head))}),
            (b"", {"Inference-Header-Content-Length": "99999"}),
        ]:
            r = await c.post("/v2/models/rec/infer", content=head + extra, headers=headers)
            assert r.status_code == 400, r.text
            assert r.headers["x-reason"] == "malformed"


def test_bytes_codec_round_trips_and_rejects_garbage() -> None:
    elements = [b"", b"a", "✓".encode(), b"x" * 300]
    assert unpack_bytes(pack_bytes(elements), 4, "t") == elements
    with pytest.raises(ApiError):
        unpack_bytes(pack_bytes(elements) + b"!", 4, "t")
    with pytest.raises(ApiError):
        unpack_bytes(b"\xff\x00\x00\x00", 1, "t")
