"""Every embed route of one server, side by side: one text, one vector; one window; one norm.

The routes are OpenAI's ``/v1/embeddings``, Infinity's ``/embeddings``, TEI's ``/embed`` and
``POST /``, KServe v2's ``infer`` over HTTP and ModelInfer over gRPC. Each test runs them
on one in-process app, with a test model (exact arithmetic) and with a tiny
sentence-transformers folder on the torch engine (the real loading, prompts and tokenizer).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from batchserve_testmodels import vector
from server_helpers import build_app, client_for, embedding_model

from batchserve.engines.loader import load_model
from batchserve.models.kinds import Prompts
from batchserve.models.loader import LoadedModel
from batchserve.models.matryoshka import Matryoshka
from batchserve.server import App

pytest.importorskip("sentence_transformers")
grpc_aio = pytest.importorskip("grpc.aio")

from batchserve.server.protocols.proto import grpc_service_pb2 as pb  # noqa: E402
from batchserve.server.transport.grpc import GrpcTransport  # noqa: E402

PROMPTS = Prompts(prompts={"query": "query: ", "passage": "passage: "}, default="passage")
INFER = "/inference.GRPCInferenceService/ModelInfer"
TEXT = "how do batching servers share one forward pass"


def _build_folder(path: Path) -> Path:
    # A two-layer, 32-wide BERT with MiniLM's tokenizer, saved by sentence-transformers with
    # Transformer and mean Pooling (no Normalize) and two prompts, "passage" the default.
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    from batchserve.engines.embeddings import builtin_path

    tokenizer = AutoTokenizer.from_pretrained(str(builtin_path()), local_files_only=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    base = path.parent / "bert"
    BertModel(config).save_pretrained(str(base))
    tokenizer.save_pretrained(str(base))
    modules = [Transformer(str(base), max_seq_length=64), Pooling(32, pooling_mode="mean")]
    SentenceTransformer(
        modules=modules, prompts=PROMPTS.prompts, default_prompt_name="passage"
    ).save(str(path))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny sentence-transformers folder (no Normalize; prompts ``query``, ``passage``)."""
    return _build_folder(tmp_path_factory.mktemp("embedder") / "tiny-st")


@pytest.fixture(scope="module")
def tiny(folder: Path) -> LoadedModel:
    """The tiny folder on the torch engine, one thread."""
    return load_model(f"{folder}:backend=torch,threads=1")


def _unit(texts: Sequence[str]) -> Any:
    rows = np.asarray([vector(t, 8) for t in texts], dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _raw(texts: Sequence[str]) -> Any:
    return np.asarray([vector(t, 8) for t in texts], dtype=np.float32) * 3.0


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


async def grpc_infer(
    address: str, model: str, texts: Sequence[str], prompt: str | None = None
) -> tuple[Any, dict[str, str]]:
    """One ModelInfer of ``texts``: the ``embedding`` rows and the trailing metadata."""
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    if prompt is not None:
        request.parameters["prompt_name"].string_param = prompt
    async with grpc_aio.insecure_channel(address) as channel:
        call = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
        rpc = call(request.SerializeToString())
        response = await rpc
        trailing = await rpc.trailing_metadata()
    shape = list(response.outputs[0].shape)
    rows = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(shape)
    return rows, {k: str(v) for k, v in (trailing or ())}


def _kserve(texts: Sequence[str], prompt: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]
    }
    if prompt is not None:
        body["parameters"] = {"prompt_name": prompt}
    return body


async def every_route(http: Any, address: str, name: str, prompt: str | None) -> dict[str, Any]:
    """The vector of ``TEXT`` from each route that can name ``prompt`` (None: the default)."""
    out: dict[str, Any] = {}
    tei: dict[str, Any] = {"inputs": TEXT, "normalize": False}
    if prompt is not None:
        tei["prompt_name"] = prompt
    r = await http.post("/embed", json=tei)
    assert r.status_code == 200, r.text
    out["tei /embed"] = r.json()[0]
    r = await http.post(f"/v2/models/{name}/infer", json=_kserve([TEXT], prompt))
    assert r.status_code == 200, r.text
    out["kserve http"] = r.json()["outputs"][0]["data"]
    rows, _ = await grpc_infer(address, name, [TEXT], prompt)
    out["kserve grpc"] = rows[0]
    if prompt is None:  # these routes have no field for a prompt's name
        r = await http.post("/v1/embeddings", json={"model": name, "input": TEXT})
        out["openai"] = r.json()["data"][0]["embedding"]
        r = await http.post("/embeddings", json={"model": name, "input": [TEXT]})
        out["infinity"] = r.json()["data"][0]["embedding"]
        r = await http.post("/", json={"inputs": TEXT, "parameters": {"normalize": False}})
        out["tei POST /"] = r.json()[0]
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def _cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("prompt", [None, "query"])
async def test_every_route_gives_one_text_one_vector_with_the_default_or_a_named_prompt(
    prompt: str | None,
) -> None:
    app = build_app({"emb": embedding_model(_raw, dim=8, prompts=PROMPTS)})
    async with serving(app) as (http, address):
        vectors = await every_route(http, address, "emb", prompt)
    expected = _raw([PROMPTS.prompts[prompt or "passage"] + TEXT])[0]
    assert len(vectors) == (3 if prompt else 6)
    for route, got in vectors.items():
        assert got == pytest.approx(expected, abs=1e-6), route


@pytest.mark.parametrize("prompt", [None, "query"])
async def test_a_real_folder_gives_encode_s_vector_on_every_route(
    tiny: LoadedModel, folder: Path, prompt: str | None
) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    # encode() applies the folder's default prompt itself when none is named.
    expected = reference.encode([TEXT], prompt_name=prompt)[0]
    app = build_app({"tiny": tiny})
    async with serving(app) as (http, address):
        vectors = await every_route(http, address, "tiny", prompt)
    engine = np.asarray(tiny.fn([PROMPTS.prompts[prompt or "passage"] + TEXT]))[0]
    for route, got in vectors.items():
        assert got == pytest.approx(engine, abs=1e-6), route
        assert _cosine(got, expected) >= 0.9999, route


async def test_an_unknown_prompt_name_is_refused_naming_the_field() -> None:
    app = build_app(
        {"emb": embedding_model(_unit, dim=8, prompts=PROMPTS), "plain": embedding_model(_unit)}
    )
    async with serving(app) as (http, address):
        r = await http.post("/v2/models/emb/infer", json=_kserve(["a"], "nope"))
        assert r.status_code == 422
        assert r.json()["error"] == (
            "parameters.prompt_name 'nope' is not known: this model defines passage, query"
        )
        assert r.headers["x-reason"] == "invalid"
        r = await http.post("/v2/models/plain/infer", json=_kserve(["a"], "query"))
        assert r.status_code == 422
        assert "this model defines no prompts" in r.json()["error"]
        body = _kserve(["a"])
        body["parameters"] = {"prompt_name": 3}
        r = await http.post("/v2/models/emb/infer", json=body)
        assert r.status_code == 422
        assert r.json()["error"].startswith("parameters.prompt_name must be the name")
        r = await http.post("/embed", json={"model": "emb", "inputs": "a", "prompt_name": "x"})
        assert (r.status_code, r.json()["error_type"]) == (422, "validation")
        assert r.json()["error"].startswith("prompt_name 'x' is not known")
        with pytest.raises(grpc_aio.AioRpcError) as info:
            await grpc_infer(address, "emb", ["a"], "nope")
    assert info.value.code().name == "INVALID_ARGUMENT"
    assert "parameters.prompt_name 'nope' is not known" in str(info.value.details())


async def test_a_prompt_name_for_a_model_of_another_kind_is_refused() -> None:
    app = build_app({"gen": LoadedModel(spec="g", fn=lambda rows: rows)})
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}],
        "parameters": {"prompt_name": "query"},
    }
    async with client_for(app) as http:
        r = await http.post("/v2/models/gen/infer", json=body)
    assert r.status_code == 422
    assert r.json()["error"] == (
        "parameters.prompt_name applies to an embedding model; model 'gen' is a generic model"
    )


# -- the window -----------------------------------------------------------------------------

WINDOW = 6
SHORT, LONG = "a b", "a b c d e f g h i j"  # 4 and 12 tokens (two are special)


def _words() -> LoadedModel:
    # A word is a token, plus two special tokens; the window of 6 cuts LONG to 6.
    return embedding_model(
        _unit,
        dim=8,
        normalized=True,
        count_tokens=lambda ts: [min(len(t.split()) + 2, WINDOW) for t in ts],
        untruncated_tokens=lambda ts: [len(t.split()) + 2 for t in ts],
        max_input_tokens=WINDOW,
    )


async def test_truncate_false_is_refused_on_every_route_that_has_the_flag() -> None:
    app = build_app({"emb": _words()})
    async with client_for(app) as http:
        for path, body in [
            ("/embed", {"inputs": [SHORT, LONG], "truncate": False}),
            ("/", {"inputs": [SHORT, LONG], "parameters": {"truncate": False}}),
            (
                "/similarity",
                {
                    "inputs": {"source_sentence": SHORT, "sentences": [LONG]},
                    "parameters": {"truncate": False},
                },
            ),
        ]:
            r = await http.post(path, json=body)
            assert r.status_code == 413, (path, r.text)
            # The embed task (/embed, and / for an embedder) can split: it says how.
            split = ', or long_inputs: {"split": true} to embed it in windows'
            assert r.json() == {
                "error": "input 1 is 12 tokens, over the model's window of 6; send "
                "truncate=true (the default) to truncate it" + ("" if "sim" in path else split),
                "error_type": "validation",
            }
        r = await http.post("/embed", json={"inputs": [SHORT, "a b c d"], "truncate": False})
        assert r.status_code == 200  # exactly the window is not over it


async def test_every_route_that_truncated_says_so_and_counts_the_tokens_it_ran() -> None:
    app = build_app({"emb": _words()})
    texts = [SHORT, LONG, "a b c d"]  # 4, 6 of 12, 6 (exactly the window) tokens
    async with serving(app) as (http, address):
        answers = {
            "tei": await http.post("/embed", json={"inputs": texts}),
            "tei POST /": await http.post("/", json={"inputs": texts}),
            "openai": await http.post("/v1/embeddings", json={"input": texts}),
            "infinity": await http.post("/embeddings", json={"input": texts}),
            "kserve": await http.post("/v2/models/emb/infer", json=_kserve(texts)),
        }
        _, metadata = await grpc_infer(address, "emb", texts)
        short = await http.post("/v1/embeddings", json={"input": [SHORT, "a b c d"]})
        short_grpc = (await grpc_infer(address, "emb", [SHORT]))[1]
    for route, r in answers.items():
        assert r.status_code == 200, route
        assert r.headers["x-truncated-inputs"] == "1", route
    assert metadata["x-truncated-inputs"] == "1"
    assert answers["tei"].headers["x-compute-tokens"] == "16"
    assert answers["openai"].json()["usage"] == {"prompt_tokens": 16, "total_tokens": 16}
    assert answers["infinity"].json()["usage"]["prompt_tokens"] == 16
    assert "x-truncated-inputs" not in short.headers
    assert "x-truncated-inputs" not in short_grpc


async def test_a_real_folder_is_refused_and_counted_by_its_own_tokenizer(
    tiny: LoadedModel, folder: Path
) -> None:
    from transformers import AutoTokenizer

    window = tiny.max_input_tokens
    assert window is not None
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    long = " ".join(["batching"] * (2 * window))
    full = len(tokenizer("passage: " + long)["input_ids"])  # the default prompt's included
    short = len(tokenizer("passage: " + TEXT)["input_ids"])
    assert full > window > short
    app = build_app({"tiny": tiny})
    async with client_for(app) as http:
        r = await http.post("/embed", json={"inputs": [TEXT, long], "truncate": False})
        assert r.status_code == 413
        assert r.json()["error"].startswith(f"input 1 is {full} tokens, over the model's window")
        r = await http.post("/v1/embeddings", json={"input": [TEXT, long]})
        assert r.json()["usage"]["prompt_tokens"] == short + window
        assert r.headers["x-truncated-inputs"] == "1"


# -- normalize ------------------------------------------------------------------------------


async def test_tei_normalize_scales_only_what_is_not_unit_length() -> None:
    app = build_app(
        {
            "raw": embedding_model(
                _raw, dim=8, normalized=False, matryoshka=Matryoshka(dimensions=(3,))
            ),
            "unit": embedding_model(_unit, dim=8, normalized=True),
            "unknown": embedding_model(_raw, dim=8),
        }
    )
    raw, unit = _raw([TEXT])[0], _unit([TEXT])[0]
    async with client_for(app) as http:

        async def embed(**body: Any) -> Any:
            r = await http.post("/embed", json={"inputs": TEXT, **body})
            assert r.status_code == 200, r.text
            return np.asarray(r.json()[0])

        assert np.linalg.norm(raw) > 1.5  # the raw model's vectors are not unit length
        assert await embed(model="raw", normalize=False) == pytest.approx(raw, abs=1e-5)
        assert await embed(model="raw") == pytest.approx(raw / np.linalg.norm(raw), abs=1e-6)
        cut = await embed(model="raw", normalize=False, dimensions=3)
        assert cut == pytest.approx(raw[:3], abs=1e-5)
        cut = await embed(model="raw", dimensions=3)
        assert cut == pytest.approx(raw[:3] / np.linalg.norm(raw[:3]), abs=1e-6)
        # A model that does not say whether its vectors are unit length is scaled when asked.
        got = await embed(model="unknown")
        assert got == pytest.approx(raw / np.linalg.norm(raw), abs=1e-6)
        # A unit-length model's vectors are left as they are: the same bits as OpenAI's.
        openai = await http.post("/v1/embeddings", json={"model": "unit", "input": TEXT})
        assert (await embed(model="unit")).tolist() == openai.json()["data"][0]["embedding"]
        assert await embed(model="unit", normalize=False) == pytest.approx(unit, abs=1e-6)
        # OpenAI and KServe return the model's own vectors.
        openai = await http.post("/v1/embeddings", json={"model": "raw", "input": TEXT})
        assert openai.json()["data"][0]["embedding"] == pytest.approx(raw, abs=1e-5)
        kserve = await http.post("/v2/models/raw/infer", json=_kserve([TEXT]))
        assert kserve.json()["outputs"][0]["data"] == pytest.approx(raw, abs=1e-5)


async def test_a_real_folder_s_own_vectors_with_normalize_false(tiny: LoadedModel) -> None:
    # Whatever the engine returns (scaled to unit length today; the folder's own modules,
    # no Normalize here, once the engines run them as they are), normalize=false returns
    # it, and normalize=true a unit vector.
    own = np.asarray(tiny.fn(["passage: " + TEXT]))[0]
    app = build_app({"tiny": tiny})
    async with client_for(app) as http:
        r = await http.post("/embed", json={"inputs": TEXT, "normalize": False})
        assert r.json()[0] == pytest.approx(own, abs=1e-6)
        r = await http.post("/embed", json={"inputs": TEXT})
        assert np.linalg.norm(r.json()[0]) == pytest.approx(1.0, abs=1e-6)
        assert _cosine(r.json()[0], own) == pytest.approx(1.0, abs=1e-6)
