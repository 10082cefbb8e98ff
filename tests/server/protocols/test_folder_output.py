"""A folder's own output on the routes: its pooling and window in ``/info``, its vectors as is.

Served in-process from zoo folders on torch: a folder with no ``Normalize`` module is
answered its own unnormalized vectors (and ``dimensions`` cuts them as
``encode(..., truncate_dim=N)`` does), a last-token folder says so in TEI's spelling, and
the default prompt reaches the vector as ``encode`` applies it.
"""

from __future__ import annotations

import numpy as np
import pytest
from server_helpers import build_app, client_for

from engine_fixtures import Zoo

pytest.importorskip("sentence_transformers")

from batchserve.engines.loader import load_model
from batchserve.server import RequestLimits

TEXTS = ["  a text with spaces around it ", "another one", "x"]


async def test_a_folder_without_normalize_is_answered_its_own_vectors(zoo: Zoo) -> None:
    from sentence_transformers import SentenceTransformer

    folder = zoo.folder("roberta-max")
    model = load_model(f"{folder}:backend=torch,threads=1")
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    assert not np.allclose(np.linalg.norm(want, axis=1), 1.0)  # it has no Normalize
    # The folder declares no Matryoshka dimensions: a prefix takes --any-dimensions.
    app = build_app({"m": model}, limits=RequestLimits(any_dimensions=True))
    async with client_for(app) as c:
        info = (await c.get("/info")).json()
        assert info["model_type"] == {"embedding": {"pooling": "max"}}
        assert info["max_input_length"] == 512
        r = await c.post("/v1/embeddings", json={"input": TEXTS})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]])
        assert np.allclose(got, want, atol=1e-4)  # the same vectors, lengths and all
        r = await c.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 8})
        cut = np.array([d["embedding"] for d in r.json()["data"]])
        assert np.allclose(cut, want[:, :8], atol=1e-4)  # cut, not scaled back to unit length


async def test_info_reports_the_folders_pooling_and_window(zoo: Zoo) -> None:
    model = load_model(f"{zoo.folder('qwen3-lasttoken')}:backend=torch,threads=1")
    async with client_for(build_app({"m": model})) as c:
        info = (await c.get("/info")).json()
    assert info["model_type"] == {"embedding": {"pooling": "last_token"}}  # TEI's spelling
    assert info["max_input_length"] == 1024


async def test_the_default_prompt_reaches_the_vector_as_encode_applies_it(zoo: Zoo) -> None:
    from sentence_transformers import SentenceTransformer

    folder = zoo.folder("qwen2-mean-prompt-excluded")  # its prompt's tokens are not pooled
    library = SentenceTransformer(str(folder), device="cpu")
    model = load_model(f"{folder}:backend=torch,threads=1")
    async with client_for(build_app({"m": model})) as c:
        r = await c.post("/v1/embeddings", json={"input": ["what is batching"]})
        default = np.array(r.json()["data"][0]["embedding"])
        r = await c.post("/embed", json={"inputs": "what is batching", "prompt_name": "passage"})
        passage = np.array(r.json()[0])
    assert np.allclose(default, library.encode("what is batching"), atol=1e-4)
    want = library.encode("what is batching", prompt_name="passage")
    cosine = passage @ want / np.linalg.norm(passage) / np.linalg.norm(want)
    assert cosine >= 0.9999  # TEI's /embed normalizes by default: the direction is the library's
