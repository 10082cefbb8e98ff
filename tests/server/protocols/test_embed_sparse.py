"""A sparse embedder served: TEI's ``/embed_sparse``, KServe v2 over HTTP and gRPC.

In-process, a tiny random-weight SPLADE folder (``tests/sparse_zoo.py``) on torch: each
text's terms and weights are ``SparseEncoder.encode``'s, batched with texts of other
lengths; the dense routes refuse it naming ``/embed_sparse``; bad bodies are 422 naming
the field.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from server_helpers import build_app, client_for

from batchserve.engines.loader import load_model
from batchserve.models.loader import LoadedModel
from batchserve.server import App
from batchserve.server.settings import RequestLimits
from sparse_zoo import build_sparse_folder

pytest.importorskip("sentence_transformers")
grpc_aio = pytest.importorskip("grpc.aio")

from batchserve.server.protocols.proto import grpc_service_pb2 as pb  # noqa: E402
from batchserve.server.transport.grpc import GrpcTransport  # noqa: E402

INFER = "/inference.GRPCInferenceService/ModelInfer"
TEXTS = [
    "what is dynamic batching",
    "Sparse retrieval weighs the words of a text.",
    "",
    " ".join(["servers share one forward pass"] * 20),
    "x",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SparseEncoder folder (sentence-transformers 6's layout; a ``query`` prompt)."""
    return build_sparse_folder(tmp_path_factory.mktemp("sparse-served"), layout="st6")


@pytest.fixture(scope="module")
def sparse(folder: Path) -> LoadedModel:
    """The folder on torch, one thread."""
    return load_model(f"{folder}:backend=torch,threads=1")


def reference(folder: Path, texts: list[str], **kwargs: Any) -> npt.NDArray[np.float32]:
    from sentence_transformers import SparseEncoder

    rows = SparseEncoder(str(folder), device="cpu").encode(
        texts, convert_to_sparse_tensor=False, convert_to_tensor=True, **kwargs
    )
    return np.asarray(rows.numpy(), dtype=np.float32)


def assert_terms(answer: list[list[dict[str, Any]]], want: npt.NDArray[np.float32]) -> None:
    """TEI's answer holds each row's nonzero terms, ascending, within 1e-4 relative."""
    assert len(answer) == len(want)
    for i, (terms, row) in enumerate(zip(answer, want, strict=True)):
        indices = [t["index"] for t in terms]
        values = np.array([t["value"] for t in terms], dtype=np.float32)
        assert indices == sorted(indices), i
        assert all(v != 0 for v in values), i
        assert indices == np.flatnonzero(row).tolist(), f"text {i}: other terms"
        expected = row[indices]
        assert np.all(np.abs(values - expected) <= np.maximum(1e-4 * expected, 1e-7)), i


@contextlib.asynccontextmanager
async def serving(app: App) -> AsyncIterator[tuple[Any, str]]:
    """The app over in-process HTTP and gRPC on 127.0.0.1: (client, gRPC address)."""
    async with client_for(app) as http:
        transport = GrpcTransport(app)
        port = await transport.start("127.0.0.1", 0)
        try:
            yield http, f"127.0.0.1:{port}"
        finally:
            await transport.stop(None)


async def grpc_rows(address: str, model: str, texts: Sequence[str]) -> Any:
    """One ModelInfer of ``texts``: its output's name and rows."""
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    async with grpc_aio.insecure_channel(address) as channel:
        call = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
        response = await call(request.SerializeToString())
    output = response.outputs[0]
    rows = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(list(output.shape))
    return output.name, rows


async def test_embed_sparse_answers_sparse_encoder_terms(folder: Path, sparse: LoadedModel) -> None:
    want = reference(folder, TEXTS)
    async with client_for(build_app({"splade": sparse})) as c:
        r = await c.post("/embed_sparse", json={"inputs": TEXTS})
        assert r.status_code == 200, r.text
        assert_terms(r.json(), want)
        assert int(r.headers["x-compute-tokens"]) > len(TEXTS)
        one = await c.post("/embed_sparse", json={"inputs": TEXTS[0]})  # a text: a list of one
        assert_terms(one.json(), want[:1])
        r = await c.post("/embed_sparse", json={"inputs": TEXTS[:2], "prompt_name": "query"})
        assert_terms(r.json(), reference(folder, TEXTS[:2], prompt_name="query"))
        root = await c.post("/", json={"inputs": TEXTS[:2]})  # TEI routes / by the model
        assert root.status_code == 200
        assert root.json() == (await c.post("/embed_sparse", json={"inputs": TEXTS[:2]})).json()
        info = (await c.get("/info")).json()
        assert info["model_type"] == {"embedding": {"pooling": "splade"}}
        assert info["kind"] == "sparse"


async def test_kserve_answers_the_whole_row_over_http_and_grpc(
    folder: Path, sparse: LoadedModel
) -> None:
    texts = [t for t in TEXTS if t]  # KServe refuses an empty text, as it does an embedder's
    want = reference(folder, texts)
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    async with serving(build_app({"splade": sparse})) as (c, address):
        meta = (await c.get("/v2/models/splade")).json()
        width = want.shape[1]
        assert meta["outputs"] == [
            {"name": "sparse_embedding", "datatype": "FP32", "shape": [-1, width]}
        ]
        r = await c.post("/v2/models/splade/infer", json=body)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert out["name"] == "sparse_embedding"
        assert out["shape"] == [len(texts), width]
        rows = np.asarray(out["data"], dtype=np.float32).reshape(len(texts), width)
        terms = [[{"index": int(i), "value": float(row[i])} for i in np.flatnonzero(row)]
                 for row in rows]  # fmt: skip
        assert_terms(terms, want)
        name, grpc = await grpc_rows(address, "splade", texts)
        assert name == "sparse_embedding"
        assert np.array_equal(grpc, rows)


async def test_a_text_among_others_gets_the_terms_it_gets_alone(sparse: LoadedModel) -> None:
    async with client_for(build_app({"splade": sparse})) as c:
        together = (await c.post("/embed_sparse", json={"inputs": TEXTS})).json()
        for i, text in enumerate(TEXTS):
            alone = (await c.post("/embed_sparse", json={"inputs": [text]})).json()[0]
            assert [t["index"] for t in alone] == [t["index"] for t in together[i]]
            got = np.array([t["value"] for t in alone])
            assert np.allclose(got, [t["value"] for t in together[i]], rtol=1e-5, atol=1e-6)


async def test_the_dense_routes_refuse_a_sparse_model_naming_embed_sparse(
    sparse: LoadedModel,
) -> None:
    async with client_for(build_app({"splade": sparse})) as c:
        for path, body in (
            ("/embed", {"inputs": "a"}),
            ("/v1/embeddings", {"input": "a"}),
            ("/embeddings", {"input": "a"}),
        ):
            r = await c.post(path, json=body)
            assert r.status_code == 400, (path, r.text)
            assert "is a sparse model" in r.text, path
            assert "use POST /embed_sparse" in r.text, path


async def test_embed_sparse_is_refused_by_a_dense_model() -> None:
    async with client_for(build_app({"dense": "minilm:backend=torch,threads=1"})) as c:
        r = await c.post("/embed_sparse", json={"inputs": "a"})
        assert r.status_code == 400, r.text
        assert "is an embedding model and does not answer POST /embed_sparse" in r.text


async def test_bad_bodies_are_refused_naming_the_field(sparse: LoadedModel) -> None:
    limits = RequestLimits(max_input_chars=2000)
    async with client_for(build_app({"splade": sparse}, limits=limits)) as c:
        cases: list[tuple[Any, int, str]] = [
            ({}, 422, "inputs is required"),
            ({"inputs": 5}, 422, "inputs"),
            ({"inputs": ["a", 3]}, 422, "inputs[1]"),
            ({"inputs": []}, 400, "inputs must not be empty"),
            ({"inputs": "a", "truncation_direction": "Left"}, 422, "truncation_direction"),
            ({"inputs": "a", "truncate": "yes"}, 422, "truncate"),
            ({"inputs": "a", "prompt_name": "nope"}, 422, "prompt_name"),
            ({"inputs": "a " * 1500}, 413, "inputs must be at most 2000 characters"),
            ({"inputs": ["a", "word " * 600], "truncate": False}, 413, "inputs[1]"),
        ]
        for body, status, names in cases:
            r = await c.post("/embed_sparse", json=body)
            assert r.status_code == status, (body, r.text)
            assert names in r.json()["error"], (body, r.text)


@pytest.mark.slow
def test_batchserve_serve_takes_a_bare_masked_lm_with_pooling_splade(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import httpx
    from server_helpers import server_process

    from batchserve.cli import build_parser
    from batchserve.cli.serve import build_settings

    bare = build_sparse_folder(tmp_path_factory.mktemp("sparse-bare"), layout="bare")
    argv = ["serve", "--model", f"splade={bare}", "--pooling", "splade", "--threads", "1"]
    settings = build_settings(build_parser().parse_args(argv), environ={})
    assert settings.models[0].spec == f"{bare}:threads=1,pooling=splade"
    with server_process(argv[1:]) as server:
        r = httpx.post(f"{server.url}/embed_sparse", json={"inputs": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
        assert_terms(r.json(), reference(bare, TEXTS))
        code, err = server.stop()
    assert code == 0, err
