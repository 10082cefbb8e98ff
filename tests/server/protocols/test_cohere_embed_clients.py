"""The cohere SDK's embed, v2 and v1, against a real ``batchserve serve --model FOLDER``.

The server is a subprocess on port 0 serving a zoo folder (``bert-cls``) on torch; the
clients are used as Cohere's documentation shows them, with the server's URL. Each answer
is the one the same body gets over plain HTTP, and the packed types are
``quantize_embeddings`` of the float vectors the client received (int8 and uint8 are held
to the library, calibration and all, in ``test_cohere_embed.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from server_helpers import ServerProcess, server_process

pytestmark = pytest.mark.slow

cohere = pytest.importorskip("cohere")
quantize_embeddings = pytest.importorskip(
    "sentence_transformers.util.quantization"
).quantize_embeddings

TEXTS = ["how do batching servers share one forward pass", "a cat", "word " * 300]
TYPES = ["float", "int8", "uint8", "binary", "ubinary"]


@pytest.fixture(scope="module")
def server(zoo: Any) -> Iterator[ServerProcess]:
    folder = zoo.folder("bert-cls")
    # The folder declares no Matryoshka dimensions: output_dimension takes --any-dimensions.
    args = ["--model", str(folder), "--backend", "torch", "--max-wait", "2ms", "--any-dimensions"]
    with server_process(args) as process:
        yield process


def _raw(server: ServerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.url}{path}", json=body)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def test_client_v2_embeds_every_type(server: ServerProcess) -> None:
    with httpx.Client() as http:
        client = cohere.ClientV2(base_url=server.url, api_key="x", httpx_client=http)
        response = client.embed(
            model="embed-v4.0",
            texts=TEXTS,
            input_type="search_document",
            embedding_types=TYPES,
            truncate="START",
        )
    raw = _raw(
        server,
        "/v2/embed",
        {
            "texts": TEXTS,
            "input_type": "search_document",
            "embedding_types": TYPES,
            "truncate": "START",
        },
    )["embeddings"]
    embeddings = response.embeddings
    assert embeddings.float_ == raw["float"]
    for kind in TYPES[1:]:
        assert getattr(embeddings, kind) == raw[kind], kind
    floats = np.asarray(embeddings.float_, dtype=np.float32)
    assert floats.shape == (3, 32)
    for kind in ("binary", "ubinary"):
        expected = np.asarray(quantize_embeddings(floats, kind))
        assert np.asarray(getattr(embeddings, kind), dtype=expected.dtype).tobytes() == (
            expected.tobytes()
        )
    assert all(-128 <= v <= 127 for row in embeddings.int8 for v in row)
    assert response.texts == TEXTS
    assert response.meta is not None
    assert response.meta.billed_units is not None
    assert response.meta.billed_units.input_tokens


def test_client_v2_output_dimension_and_truncate_none(server: ServerProcess) -> None:
    with httpx.Client() as http:
        client = cohere.ClientV2(base_url=server.url, api_key="x", httpx_client=http)
        response = client.embed(
            model="embed-v4.0",
            texts=TEXTS[:2],
            input_type="search_query",
            embedding_types=["float", "uint8"],
            output_dimension=16,
        )
        with pytest.raises(cohere.core.ApiError) as refused:
            client.embed(model="m", texts=TEXTS, input_type="search_query", truncate="NONE")
    assert len(response.embeddings.float_[0]) == 16
    assert len(response.embeddings.uint8[0]) == 16
    assert refused.value.status_code == 413
    assert "texts[2]" in refused.value.body["message"]


# cohere 7.3's v1 client merges its batches' answers with pydantic calls pydantic 2
# deprecates (instance model_fields, parse_obj): the SDK's warnings, not the server's.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_client_v1_embeds_floats_and_every_type(server: ServerProcess) -> None:
    with httpx.Client() as http:
        client = cohere.Client(base_url=server.url, api_key="x", httpx_client=http)
        floats = client.embed(texts=TEXTS, model="embed-english-v3.0", input_type="search_query")
        by_type = client.embed(
            texts=TEXTS,
            model="embed-english-v3.0",
            input_type="search_query",
            embedding_types=TYPES,
        )
    assert floats.response_type == "embeddings_floats"
    assert by_type.response_type == "embeddings_by_type"
    raw = _raw(
        server,
        "/v1/embed",
        {"texts": TEXTS, "input_type": "search_query", "embedding_types": TYPES},
    )["embeddings"]
    assert floats.embeddings == raw["float"]
    assert by_type.embeddings.float_ == raw["float"]
    for kind in TYPES[1:]:
        assert getattr(by_type.embeddings, kind) == raw[kind], kind
